package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// Helpers of fixtures.go: VMs through the API, then the disk files as vSphere would have written them.

// newDisk is a disk to create with a VM.
type newDisk struct {
	backing    types.BaseVirtualDeviceBackingInfo
	capacityKB int64
	crypto     types.BaseCryptoSpec
}

// flatDisk is a thin flat disk NAME/NAME.vmdk on datastore ds, encrypted with crypto when set.
func flatDisk(ds, name string, crypto types.BaseCryptoSpec) newDisk {
	return newDisk{
		backing: &types.VirtualDiskFlatVer2BackingInfo{
			VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{
				FileName: fmt.Sprintf("[%s] %s/%s.vmdk", ds, name, name),
			},
			DiskMode:        string(types.VirtualDiskModePersistent),
			ThinProvisioned: types.NewBool(true),
		},
		capacityKB: fixtureDiskKB,
		crypto:     crypto,
	}
}

// createVM creates a VM with a PVSCSI controller and disks, its home at vmPath ("[ds]" or "[ds] dir/x.vmx").
func (f *fixtures) createVM(name, vmPath string, pool *object.ResourcePool, host *object.HostSystem,
	crypto types.BaseCryptoSpec, disks ...newDisk) (*object.VirtualMachine, error) {
	var devices object.VirtualDeviceList
	ctrl, err := devices.CreateSCSIController("pvscsi")
	if err != nil {
		return nil, err
	}
	devices = append(devices, ctrl)
	changes := []types.BaseVirtualDeviceConfigSpec{
		&types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationAdd, Device: ctrl},
	}
	for _, d := range disks {
		disk := &types.VirtualDisk{VirtualDevice: types.VirtualDevice{Backing: d.backing}, CapacityInKB: d.capacityKB}
		devices.AssignController(disk, ctrl.(types.BaseVirtualController))
		devices = append(devices, disk)
		change := &types.VirtualDeviceConfigSpec{
			Operation:     types.VirtualDeviceConfigSpecOperationAdd,
			FileOperation: types.VirtualDeviceConfigSpecFileOperationCreate,
			Device:        disk,
		}
		if d.crypto != nil {
			change.Backing = &types.VirtualDeviceConfigSpecBackingSpec{Crypto: d.crypto}
		}
		changes = append(changes, change)
	}
	spec := types.VirtualMachineConfigSpec{
		Name:         name,
		GuestId:      "rhel9_64Guest",
		NumCPUs:      1,
		MemoryMB:     1024,
		Files:        &types.VirtualMachineFileInfo{VmPathName: vmPath},
		DeviceChange: changes,
	}
	if crypto != nil {
		spec.Crypto = crypto
	}
	task, err := f.vmDir.CreateVM(f.ctx, spec, pool, host)
	if err != nil {
		return nil, err
	}
	info, err := task.WaitForResult(f.ctx, nil)
	if err != nil {
		return nil, err
	}
	return object.NewVirtualMachine(f.c, info.Result.(types.ManagedObjectReference)), nil
}

// createPoweredOn creates a VM in its own directory on ds and powers it on, as a production VM runs.
func (f *fixtures) createPoweredOn(name, ds string, pool *object.ResourcePool, host *object.HostSystem,
	crypto types.BaseCryptoSpec, disks ...newDisk) error {
	vm, err := f.createVM(name, "["+ds+"]", pool, host, crypto, disks...)
	if err != nil {
		return err
	}
	return wait(vm.PowerOn(f.ctx))
}

// standaloneHost is DC0_H0 and its resource pool: the host of LocalDS_0 and of the demo VMs.
func (f *fixtures) standaloneHost() (*object.HostSystem, *object.ResourcePool, error) {
	host, err := f.finder.HostSystem(f.ctx, "DC0_H0")
	if err != nil {
		return nil, nil, err
	}
	pool, err := host.ResourcePool(f.ctx)
	return host, pool, err
}

// datastore is the simulator's object of the named datastore in DC0 (its Summary.Url is a local directory).
func (f *fixtures) datastore(name string) *simulator.Datastore {
	for _, e := range f.m.Service.Context.Map.All("Datastore") {
		if ds := e.(*simulator.Datastore); ds.Name == name {
			return ds
		}
	}
	panic("no datastore " + name)
}

// option is the value of one of the simulator's settings.
func (f *fixtures) option(key string) (string, error) {
	for _, o := range f.m.Service.Context.Map.OptionManager().Setting {
		if v := o.GetOptionValue(); v.Key == key {
			return fmt.Sprint(v.Value), nil
		}
	}
	return "", fmt.Errorf("no setting %s", key)
}

// renameHome rewrites "[ds] dir/..." paths of vm (its files and disk backings) to "[ds] newDir/...".
func (f *fixtures) renameHome(ref *object.VirtualMachine, ds, dir, newDir string) {
	ctx := f.m.Service.Context
	vm := ctx.Map.Get(ref.Reference()).(*simulator.VirtualMachine)
	from, to := fmt.Sprintf("[%s] %s/", ds, dir), fmt.Sprintf("[%s] %s/", ds, newDir)
	rename := func(p *string) { *p = strings.Replace(*p, from, to, 1) }
	ctx.WithLock(vm, func() {
		files := &vm.Config.Files
		for _, p := range []*string{&files.VmPathName, &files.SnapshotDirectory, &files.SuspendDirectory, &files.LogDirectory, &vm.Summary.Config.VmPathName} {
			rename(p)
		}
		for _, d := range vm.Config.Hardware.Device {
			if b, ok := d.GetVirtualDevice().Backing.(types.BaseVirtualDeviceFileBackingInfo); ok {
				rename(&b.GetVirtualDeviceFileBackingInfo().FileName)
			}
		}
		if vm.LayoutEx != nil {
			for i := range vm.LayoutEx.File {
				rename(&vm.LayoutEx.File[i].Name)
			}
		}
	})
}

// setBackingObjectID sets the disks' backingObjectId: the object (vSAN UUID, vVol id) vSphere reports for a
// disk that is an object rather than a file.
func (f *fixtures) setBackingObjectID(ref *object.VirtualMachine, id string) {
	ctx := f.m.Service.Context
	vm := ctx.Map.Get(ref.Reference()).(*simulator.VirtualMachine)
	ctx.WithLock(vm, func() {
		for _, d := range vm.Config.Hardware.Device {
			if disk, ok := d.(*types.VirtualDisk); ok {
				if b, ok := disk.Backing.(types.BaseVirtualDeviceFileBackingInfo); ok {
					b.GetVirtualDeviceFileBackingInfo().BackingObjectId = &id
				}
			}
		}
	})
}

// vsanNamespace finds the UUID-named namespace directory under a vSAN datastore's root that holds file.
func vsanNamespace(root, file string) (string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(root, e.Name(), file)); err == nil {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("no namespace holds %s", file)
}

// vmdkDescriptor is the text of a VMDK descriptor file, in the layout ESXi writes (VMware Virtual Disk
// Format 5.0, qemu block/vmdk.c).
type vmdkDescriptor struct {
	createType string
	parentCID  string // "" means no parent (ffffffff)
	parentHint string
	extents    []string
	ddb        [][2]string
}

func (d vmdkDescriptor) text() string {
	var capacitySectors int64
	for _, e := range d.extents {
		var sectors int64
		_, _ = fmt.Sscanf(e, "RW %d", &sectors)
		capacitySectors += sectors
	}
	var b strings.Builder
	parent := d.parentCID
	if parent == "" {
		parent = "ffffffff"
	}
	fmt.Fprintf(&b, "# Disk DescriptorFile\nversion=1\nencoding=\"UTF-8\"\nCID=%08x\nparentCID=%s\n", randUint32(), parent)
	fmt.Fprintf(&b, "createType=%q\n", d.createType)
	if d.parentHint != "" {
		fmt.Fprintf(&b, "parentFileNameHint=%q\n", d.parentHint)
	}
	b.WriteString("\n# Extent description\n")
	for _, e := range d.extents {
		b.WriteString(e + "\n")
	}
	b.WriteString("\n# The Disk Data Base\n#DDB\n\n")
	ddb := append([][2]string{
		{"ddb.adapterType", "pvscsi"},
		{"ddb.geometry.cylinders", fmt.Sprint(max(1, capacitySectors/(255*63)))},
		{"ddb.geometry.heads", "255"},
		{"ddb.geometry.sectors", "63"},
		{"ddb.longContentID", fmt.Sprintf("%08x%08x%08x%08x", randUint32(), randUint32(), randUint32(), randUint32())},
		{"ddb.uuid", uuidBytes()},
		{"ddb.virtualHWVersion", "19"},
	}, d.ddb...)
	for _, kv := range ddb {
		fmt.Fprintf(&b, "%s = %q\n", kv[0], kv[1])
	}
	return b.String()
}

// seSparseFileSize: the fixture's -sesparse.vmdk holds its header and nothing else.
const seSparseFileSize = 1 << 20

// seSparseMagic starts an seSparse extent (qemu block/vmdk.c: SESPARSE_CONST_HEADER_MAGIC, little-endian).
const seSparseMagic = 0x00000000cafebabe

// replaceDisk rewrites home/name.vmdk as desc and replaces the flat file vcsim made with `files` (sparse, of
// the given sizes); no files means the data lives outside the datastore's file system (vSAN, vVol objects).
func replaceDisk(home, name string, desc vmdkDescriptor, files map[string]int64) error {
	if err := os.Remove(filepath.Join(home, name+"-flat.vmdk")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(home, name+".vmdk"), []byte(desc.text()), 0o600); err != nil {
		return err
	}
	for file, size := range files {
		p := filepath.Join(home, file)
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(file, "-sesparse.vmdk") {
			var header [8]byte
			binary.LittleEndian.PutUint64(header[:], seSparseMagic)
			_, err = f.Write(header[:])
		}
		if err == nil {
			err = f.Truncate(size)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fixVcsimHeader gives a descriptor vcsim wrote the header ESXi writes: a random CID, and parentCID ffffffff
// ("no parent") where vcsim leaves both at 00000000.
func fixVcsimHeader(path string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := strings.Split(string(text), "\n")
	for i, l := range lines {
		switch l {
		case "CID=00000000":
			lines[i] = fmt.Sprintf("CID=%08x", randUint32())
		case "parentCID=00000000":
			lines[i] = "parentCID=ffffffff"
		}
	}
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600)
}

// descriptorCID reads the CID line of a descriptor (a child's parentCID must match it).
func descriptorCID(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "CID="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s has no CID", path)
}

// wait waits for a task, or returns the error of starting it.
func wait(task *object.Task, err error) error {
	if err != nil {
		return err
	}
	return task.Wait(context.Background())
}

func randUint32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func uuidHalf() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// uuidBytes formats 16 random bytes as ddb.uuid does ("60 00 C2 9f ...").
func uuidBytes() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = fmt.Sprintf("%02x", x)
	}
	return strings.Join(parts, " ")
}
