package main

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// fixtureDisk is the only disk of a fixture VM, with the URL of a file next to its descriptor.
type fixtureDisk struct {
	s       *testSim
	backing types.BaseVirtualDeviceBackingInfo
	path    object.DatastorePath
}

func (d fixtureDisk) url(file string) string {
	dir := d.path.Path[:strings.LastIndex(d.path.Path, "/")+1]
	return d.s.folderURL("DC0", d.path.Datastore, dir+file)
}

func (d fixtureDisk) descriptor() string {
	return string(d.s.expectStatus(http.MethodGet, d.s.folderURL("DC0", d.path.Datastore, d.path.Path), nil, http.StatusOK))
}

func TestFixturesAreShapedAsVSphereReportsThem(t *testing.T) {
	s := startSim(t, realism{fixtures: true})
	c := s.login()

	var stores []mo.Datastore
	retrieveAll(t, c, "Datastore", []string{"name", "summary", "info"}, &stores)
	dsTypes := map[string]string{}
	for _, ds := range stores {
		dsTypes[ds.Name] = ds.Summary.Type
		if ds.Name == vvolDatastore {
			if info, ok := ds.Info.(*types.VvolDatastoreInfo); !ok || !strings.HasPrefix(info.VvolDS.ScId, "vvol:") {
				t.Fatalf("vvolDatastore info: %#v", ds.Info)
			}
		}
	}
	if dsTypes[vsanDatastore] != "vsan" || dsTypes[vvolDatastore] != "VVOL" {
		t.Fatalf("datastore types: %v", dsTypes)
	}

	var vms []mo.VirtualMachine
	retrieveAll(t, c, "VirtualMachine", []string{"name", "runtime.powerState", "config.keyId", "config.hardware.device"}, &vms)
	disks := map[string]fixtureDisk{}
	keys := map[string]*types.CryptoKeyId{}
	for _, vm := range vms {
		var found []types.BaseVirtualDevice
		for _, d := range vm.Config.Hardware.Device {
			if _, ok := d.(*types.VirtualDisk); ok {
				found = append(found, d)
			}
		}
		if !strings.HasPrefix(vm.Name, "ferry-") {
			continue
		}
		if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn || len(found) != 1 {
			t.Fatalf("%s: %s with %d disks", vm.Name, vm.Runtime.PowerState, len(found))
		}
		backing := found[0].GetVirtualDevice().Backing
		var p object.DatastorePath
		if !p.FromString(backing.(types.BaseVirtualDeviceFileBackingInfo).GetVirtualDeviceFileBackingInfo().FileName) {
			t.Fatalf("%s: disk file name", vm.Name)
		}
		disks[vm.Name] = fixtureDisk{s: s, backing: backing, path: p}
		keys[vm.Name] = vm.Config.KeyId
	}
	if len(disks) != 5 {
		t.Fatalf("fixture VMs: %v", disks)
	}

	t.Run("vsan", func(t *testing.T) {
		d := disks[vsanVM]
		b := d.backing.(*types.VirtualDiskFlatVer2BackingInfo)
		// vSAN paths carry the namespace object's UUID, not the VM's name.
		if !regexp.MustCompile(`^[0-9a-f-]{36}/ferry-vsan-vm\.vmdk$`).MatchString(d.path.Path) || d.path.Datastore != vsanDatastore {
			t.Fatalf("vSAN disk path: %s", b.FileName)
		}
		desc := d.descriptor()
		expectLines(t, desc, `createType="vmfs"`, fmt.Sprintf(`RW %d VMFS "vsan://%s"`, fixtureDiskKB*2, objectID(b.BackingObjectId)))
		d.s.expectStatus(http.MethodGet, d.url("ferry-vsan-vm-flat.vmdk"), nil, http.StatusNotFound)
	})
	t.Run("vvol", func(t *testing.T) {
		d := disks[vvolVM]
		b := d.backing.(*types.VirtualDiskFlatVer2BackingInfo)
		id := objectID(b.BackingObjectId)
		if d.path.Datastore != vvolDatastore || !strings.HasPrefix(id, "rfc4122.") {
			t.Fatalf("vVol disk: %s %s", b.FileName, id)
		}
		desc := d.descriptor()
		if !regexp.MustCompile(`(?m)^RW 8192 VMFS "vvol://[0-9a-f]{16}-[0-9a-f]{16}/` + regexp.QuoteMeta(id) + `"$`).MatchString(desc) {
			t.Fatalf("vVol descriptor:\n%s", desc)
		}
		d.s.expectStatus(http.MethodGet, d.url("ferry-vvol-vm-flat.vmdk"), nil, http.StatusNotFound)
	})
	t.Run("encrypted", func(t *testing.T) {
		d := disks[encryptedVM]
		key := keys[encryptedVM]
		b := d.backing.(*types.VirtualDiskFlatVer2BackingInfo)
		if key == nil || key.KeyId == "" || key.ProviderId == nil || key.ProviderId.Id != keyProvider {
			t.Fatalf("config.keyId: %#v", key)
		}
		if b.KeyId == nil || b.KeyId.KeyId != key.KeyId {
			t.Fatalf("disk backing keyId: %#v", b.KeyId)
		}
		for name, k := range keys {
			if name != encryptedVM && k != nil {
				t.Fatalf("%s has a keyId", name)
			}
		}
		desc := d.descriptor()
		if !strings.Contains(desc, `encryptionKeys="vmware:key/`) {
			t.Fatalf("encrypted descriptor:\n%s", desc)
		}
		if field(t, desc, "parentCID") != "ffffffff" || field(t, desc, "CID") == "00000000" {
			t.Fatalf("encrypted descriptor's header:\n%s", desc)
		}
		flat := d.s.expectStatus(http.MethodGet, d.url("ferry-encrypted-vm-flat.vmdk"), nil, http.StatusOK)
		if len(flat) != fixtureDiskKB<<10 {
			t.Fatalf("flat file: %d bytes", len(flat))
		}
	})
	t.Run("sesparse", func(t *testing.T) {
		d := disks[seSparseVM]
		b, ok := d.backing.(*types.VirtualDiskSeSparseBackingInfo)
		if !ok || b.Parent == nil || b.Parent.FileName != "[LocalDS_0] ferry-sesparse-vm/ferry-sesparse-vm.vmdk" ||
			b.FileName != "[LocalDS_0] ferry-sesparse-vm/ferry-sesparse-vm-000001.vmdk" {
			t.Fatalf("seSparse backing: %#v", d.backing)
		}
		desc := d.descriptor()
		expectLines(t, desc, `createType="seSparse"`, `parentFileNameHint="ferry-sesparse-vm.vmdk"`,
			`RW 8192 SESPARSE "ferry-sesparse-vm-000001-sesparse.vmdk"`)
		parent := d.s.expectStatus(http.MethodGet, d.url("ferry-sesparse-vm.vmdk"), nil, http.StatusOK)
		if cid := field(t, string(parent), "CID"); cid == "00000000" || field(t, desc, "parentCID") != cid {
			t.Fatalf("child parentCID %s, parent CID %s", field(t, desc, "parentCID"), cid)
		}
		extent := d.s.expectStatus(http.MethodGet, d.url("ferry-sesparse-vm-000001-sesparse.vmdk"), nil, http.StatusOK)
		if binary.LittleEndian.Uint64(extent[:8]) != seSparseMagic {
			t.Fatalf("seSparse extent header %x", extent[:8])
		}
		if flat := d.s.expectStatus(http.MethodGet, d.url("ferry-sesparse-vm-flat.vmdk"), nil, http.StatusOK); len(flat) != fixtureDiskKB<<10 {
			t.Fatalf("parent flat file: %d bytes", len(flat))
		}
	})
	t.Run("multiextent", func(t *testing.T) {
		d := disks[multiExtentVM]
		b := d.backing.(*types.VirtualDiskFlatVer2BackingInfo)
		if b.Split == nil || !*b.Split {
			t.Fatal("split flat disk without split=true")
		}
		desc := d.descriptor()
		expectLines(t, desc, `createType="twoGbMaxExtentFlat"`)
		for i := 1; i <= extentCount; i++ {
			name := fmt.Sprintf("ferry-multiextent-vm-f%03d.vmdk", i)
			expectLines(t, desc, fmt.Sprintf(`RW %d FLAT "%s" 0`, extentKB*2, name))
			resp, _, _ := d.s.do(http.MethodHead, d.url(name), nil, nil)
			if resp.StatusCode != http.StatusOK || resp.ContentLength != extentKB<<10 {
				t.Fatalf("%s: %s, %d bytes", name, resp.Status, resp.ContentLength)
			}
		}
		d.s.expectStatus(http.MethodGet, d.url("ferry-multiextent-vm-flat.vmdk"), nil, http.StatusNotFound)
	})
}

func objectID(id *string) string {
	if id == nil {
		return ""
	}
	return *id
}

// expectLines fails unless each line is a whole line of text.
func expectLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(l) + `$`).MatchString(text) {
			t.Fatalf("no line %q in:\n%s", l, text)
		}
	}
}

// field is the value of a "key=value" header line of a descriptor.
func field(t *testing.T, text, key string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + key + `=(\S+)$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no %s in:\n%s", key, text)
	}
	return strings.Trim(m[1], `"`)
}
