package main

import (
	"context"
	"net/http"
	"testing"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/vim25/mo"
)

func TestGuestNetworkIsWhatToolsReport(t *testing.T) {
	s := startSim(t, realism{})
	u := "https://" + s.server.URL.Host + guestNetPath + "?vm=DC0_H0_VM0"
	body := []byte(`{"net": [{"macAddress": "00:50:56:aa:bb:cc", "connected": true, "deviceConfigId": 4000,
	  "ipAddress": ["192.168.122.50"],
	  "ipConfig": {"ipAddress": [{"ipAddress": "192.168.122.50", "prefixLength": 24, "origin": "manual", "state": "preferred"}]}}],
	  "ipStack": [{"dnsConfig": {"dhcp": false, "hostName": "w", "domainName": "", "ipAddress": ["192.168.122.2"]},
	  "ipRouteConfig": {"ipRoute": [{"network": "0.0.0.0", "prefixLength": 0, "gateway": {"ipAddress": "192.168.122.1", "device": "0"}}]}}]}`)
	if resp, got, _ := s.do(http.MethodPut, u, nil, body); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT: %s %s", resp.Status, got)
	}
	c := s.login()
	vm, err := find.NewFinder(c.Client).VirtualMachine(context.Background(), "DC0_H0_VM0")
	if err != nil {
		t.Fatal(err)
	}
	var seen mo.VirtualMachine
	if err := vm.Properties(context.Background(), vm.Reference(), []string{"guest.net", "guest.ipStack", "guest.ipAddress"}, &seen); err != nil {
		t.Fatal(err)
	}
	nic := seen.Guest.Net[0]
	if len(seen.Guest.Net) != 1 || nic.IpConfig.IpAddress[0].Origin != "manual" || nic.IpConfig.IpAddress[0].PrefixLength != 24 {
		t.Fatalf("guest.net: %+v", seen.Guest.Net)
	}
	route := seen.Guest.IpStack[0].IpRouteConfig.IpRoute[0]
	if route.Gateway.IpAddress != "192.168.122.1" || seen.Guest.IpStack[0].DnsConfig.IpAddress[0] != "192.168.122.2" {
		t.Fatalf("guest.ipStack: %+v", seen.Guest.IpStack)
	}
	if seen.Guest.IpAddress != "192.168.122.50" {
		t.Fatalf("guest.ipAddress: %q", seen.Guest.IpAddress)
	}
	if resp, _, _ := s.do(http.MethodPut, u, nil, []byte(`{"net": 1}`)); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a bad body: %s", resp.Status)
	}
	other := "https://" + s.server.URL.Host + guestNetPath + "?vm=nothing"
	if resp, _, _ := s.do(http.MethodPut, other, nil, []byte(`{}`)); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("no such VM: %s", resp.Status)
	}
}
