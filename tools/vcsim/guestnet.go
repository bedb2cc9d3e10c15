package main

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// guestNetPath is the lab's stand-in for VMware Tools reporting a guest's network: vcsim fills guest.net from the
// NICs with no addresses and has no ipStack, where ESXi shows what the tools in the guest report.
const guestNetPath = "/ferry-lab/guest-net"

// reportedNetwork is what VMware Tools reports: guest.net (per NIC its MAC, addresses with prefix and origin) and
// guest.ipStack (routes and DNS), in vSphere's own types.
type reportedNetwork struct {
	Net     []types.GuestNicInfo   `json:"net"`
	IpStack []types.GuestStackInfo `json:"ipStack"`
}

// guestNet serves PUT /ferry-lab/guest-net?vm=NAME with a reportedNetwork as its body: the VM's guest.net,
// guest.ipStack and guest.ipAddress become it (an empty body's lists clear them, as when the tools stop).
func (s *sim) guestNet(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut {
		http.Error(rw, "PUT only", http.StatusMethodNotAllowed)
		return
	}
	var reported reportedNetwork
	if err := json.NewDecoder(r.Body).Decode(&reported); err != nil {
		http.Error(rw, fmt.Sprintf("the body is not a reported network: %v", err), http.StatusBadRequest)
		return
	}
	if err := setGuestNetwork(s.model, r.URL.Query().Get("vm"), reported); err != nil {
		http.Error(rw, err.Error(), http.StatusNotFound)
		return
	}
	rw.WriteHeader(http.StatusNoContent)
}

func setGuestNetwork(m *simulator.Model, name string, reported reportedNetwork) error {
	ctx := m.Service.Context
	for _, e := range ctx.Map.All("VirtualMachine") {
		vm := e.(*simulator.VirtualMachine)
		if vm.Name != name {
			continue
		}
		first := ""
		for _, nic := range reported.Net {
			if len(nic.IpAddress) > 0 && first == "" {
				first = nic.IpAddress[0]
			}
		}
		ctx.Map.AtomicUpdate(ctx, vm, []types.PropertyChange{
			{Name: "guest.net", Val: reported.Net},
			{Name: "guest.ipStack", Val: reported.IpStack},
			{Name: "guest.ipAddress", Val: first},
			{Name: "summary.guest.ipAddress", Val: first},
		})
		return nil
	}
	return fmt.Errorf("no VM named %q", name)
}
