package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// How the CBT model follows vcsim: vcsim dispatches a session's calls to the registry's own objects (a
// Registry.Handler is consulted only for calls without a session), so the model watches the registry instead:
// a snapshot put in it was taken, one removed from it is gone, a VM seen powering on was stunned, and a VM's
// task that ended may have changed its changeTrackingEnabled. Each hook runs in vcsim's task, which holds the
// VM's lock.

func (c *cbtModel) install(m *simulator.Model) {
	m.Service.Context.Map.AddHandler(&cbtWatch{model: c})
}

// layeredSnapshot is a snapshot the model knows: its VM and each tracked disk's change point.
type layeredSnapshot struct {
	vm     types.ManagedObjectReference
	points map[int32]changePoint
}

type cbtWatch struct{ model *cbtModel }

func (w *cbtWatch) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "FerryCBTWatch", Value: "cbt"}
}

func (w *cbtWatch) PutObject(ctx *simulator.Context, obj mo.Reference) {
	if snap, ok := obj.(*simulator.VirtualMachineSnapshot); ok {
		vm := ctx.Map.Get(snap.Vm).(*simulator.VirtualMachine)
		w.model.snapshotTaken(ctx, vm, snap)
	}
}

func (w *cbtWatch) RemoveObject(ctx *simulator.Context, ref types.ManagedObjectReference) {
	if ref.Type == "VirtualMachineSnapshot" {
		w.model.snapshotRemoved(ctx, ref)
	}
}

func (w *cbtWatch) UpdateObject(ctx *simulator.Context, obj mo.Reference, changes []types.PropertyChange) {
	switch o := obj.(type) {
	case *mo.VirtualMachine:
		vm, ok := ctx.Map.Get(o.Self).(*simulator.VirtualMachine)
		if !ok {
			return
		}
		for _, ch := range changes {
			if ch.Name == "runtime.powerState" && ch.Val == types.VirtualMachinePowerStatePoweredOn {
				w.model.poweredOn(ctx, vm)
			}
		}
		w.model.follow(ctx, vm)
	case *mo.Task:
		if o.Info.Entity == nil || o.Info.Entity.Type != "VirtualMachine" || o.Info.State != types.TaskInfoStateSuccess {
			return
		}
		if vm, ok := ctx.Map.Get(*o.Info.Entity).(*simulator.VirtualMachine); ok {
			lock := &simulator.Context{Map: ctx.Map}
			lock.WithLock(vm, func() { w.model.follow(lock, vm) })
		}
	}
}

// follow brings the model's tracking in line with the VM's changeTrackingEnabled, and shows each disk's change
// ID on its backing (vcsim replaces the device list on some changes). A VM whose tracking is off and of which
// the model keeps nothing has nothing to follow: every update of every VM comes here.
func (c *cbtModel) follow(ctx *simulator.Context, vm *simulator.VirtualMachine) {
	c.mu.Lock()
	defer c.mu.Unlock()
	on := vm.Config != nil && vm.Config.ChangeTrackingEnabled != nil && *vm.Config.ChangeTrackingEnabled
	known := c.knows(vm)
	if !on && !known {
		return
	}
	for _, disk := range vmDisks(vm) {
		d, err := c.disk(ctx, vm, disk.Key)
		if err != nil {
			continue // not a file-backed disk: no tracking
		}
		if !known {
			// The disk is new to the model, which skipped the VM while its tracking was off: it starts off, as
			// following the VM then would have left it, so tracking turned on while the VM is off starts at once.
			d.state = trackingOff
		}
		switch {
		case !on:
			d.state, d.written = trackingOff, nil
		case d.state == trackingOff && vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn:
			d.start() // a powered-off VM tracks at once
		case d.state == trackingOff:
			d.state = trackingPending
		}
		setChangeID(disk.Backing, d.changeID())
	}
	c.power[vm.Self] = vm.Runtime.PowerState
}

// knows: whether the model keeps state for vm (its tracking was on, or it was stunned, written or queried
// under the model), which a change of its tracking must bring in line. Call with c.mu held.
func (c *cbtModel) knows(vm *simulator.VirtualMachine) bool {
	if _, ok := c.power[vm.Self]; ok {
		return true
	}
	for _, disk := range vmDisks(vm) {
		if _, ok := c.disks[diskRef{vm: vm.Self, key: disk.Key}]; ok {
			return true
		}
	}
	return false
}

// poweredOn: a power-on is a stun.
func (c *cbtModel) poweredOn(ctx *simulator.Context, vm *simulator.VirtualMachine) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.power[vm.Self] == types.VirtualMachinePowerStatePoweredOn {
		return
	}
	c.power[vm.Self] = types.VirtualMachinePowerStatePoweredOn
	for _, disk := range vmDisks(vm) {
		if d, err := c.disk(ctx, vm, disk.Key); err == nil {
			d.stun()
		}
	}
}

func (d *cbtDisk) changeID() string {
	if d.state != trackingActive {
		return ""
	}
	return d.now.String()
}

// snapshotTaken is the stun a snapshot takes: each disk's new change ID goes into the snapshot's config and the
// VM's, and (for the first snapshot) an active layer takes the guest's writes from here on, so the base holds
// exactly the snapshot; the running VM shows its disks on delta files, the snapshot keeps the base files. A
// later snapshot shares the layer: the lab models one.
func (c *cbtModel) snapshotTaken(ctx *simulator.Context, vm *simulator.VirtualMachine, snap *simulator.VirtualMachineSnapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	points := map[int32]changePoint{}
	snapDisks := map[int32]*types.VirtualDisk{}
	for _, dev := range snap.Config.Hardware.Device {
		if disk, ok := dev.(*types.VirtualDisk); ok {
			snapDisks[disk.Key] = disk
		}
	}
	for _, disk := range vmDisks(vm) {
		flat, isFlat := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		d, err := c.disk(ctx, vm, disk.Key)
		if err != nil || !isFlat {
			continue // vSAN, vVol, a foreign delta: not the model's
		}
		d.stun()
		if d.state == trackingActive {
			points[disk.Key] = d.now
		}
		if s, ok := snapDisks[disk.Key]; ok {
			setChangeID(s.Backing, d.changeID())
		}
		if d.layer == nil {
			if err := d.openLayer(c.home, diskRef{vm: vm.Self, key: disk.Key}); err != nil {
				continue
			}
			d.flat = flat
			disk.Backing = deltaBacking(flat)
			writeDeltaDescriptor(ctx, flat.FileName, d.capacity)
		}
		setChangeID(disk.Backing, d.changeID())
	}
	c.snapshots[snap.Self] = layeredSnapshot{vm: vm.Self, points: points}
}

// snapshotRemoved: the last snapshot gone, each active layer is consolidated into its base and the disk is
// flat again; a removal is a stun.
func (c *cbtModel) snapshotRemoved(ctx *simulator.Context, ref types.ManagedObjectReference) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.snapshots[ref]
	if !ok {
		return
	}
	delete(c.snapshots, ref)
	vm, ok := ctx.Map.Get(s.vm).(*simulator.VirtualMachine)
	if !ok {
		return
	}
	for _, other := range c.snapshots {
		if other.vm == s.vm {
			return // the layer stays under the remaining snapshot
		}
	}
	for _, disk := range vmDisks(vm) {
		d, ok := c.disks[diskRef{vm: vm.Self, key: disk.Key}]
		if !ok || d.layer == nil {
			continue
		}
		if err := d.consolidate(); err != nil {
			panic(fmt.Sprintf("the lab's CBT model lost disk %d of %s: %v", disk.Key, vm.Name, err))
		}
		if child, ok := disk.Backing.(*types.VirtualDiskSeSparseBackingInfo); ok && d.flat != nil {
			if local, err := localFlat(ctx, child.FileName); err == nil {
				os.Remove(strings.TrimSuffix(local, "-flat.vmdk") + ".vmdk")
			}
			disk.Backing = d.flat
		}
		d.flat = nil
		d.stun()
		setChangeID(disk.Backing, d.changeID())
	}
}

// deltaBacking is how vSphere shows a disk running on a snapshot's delta: an seSparse child "<stem>-000001.vmdk"
// whose parent is the base.
func deltaBacking(base *types.VirtualDiskFlatVer2BackingInfo) *types.VirtualDiskSeSparseBackingInfo {
	parent := &types.VirtualDiskSeSparseBackingInfo{
		VirtualDeviceFileBackingInfo: base.VirtualDeviceFileBackingInfo,
		DiskMode:                     base.DiskMode,
		GrainSize:                    4,
		Uuid:                         base.Uuid,
		ContentId:                    base.ContentId,
	}
	child := *parent
	child.FileName = strings.TrimSuffix(base.FileName, ".vmdk") + "-000001.vmdk"
	child.Parent = parent
	return &child
}

// writeDeltaDescriptor puts the child's descriptor beside the base (what ESXi writes for a snapshot on VMFS6).
// Its extent is never on the datastore: the data is the model's private layer, so a client that reads the
// live disk instead of the snapshot's base finds nothing to read.
func writeDeltaDescriptor(ctx *simulator.Context, baseFile string, capacity int64) {
	local, err := localFlat(ctx, baseFile)
	if err != nil {
		return
	}
	stem := strings.TrimSuffix(local, "-flat.vmdk")
	parentCID, err := descriptorCID(stem + ".vmdk")
	if err != nil {
		parentCID = "ffffffff"
	}
	name := stem[strings.LastIndexByte(stem, '/')+1:]
	desc := vmdkDescriptor{
		createType: "seSparse", parentCID: parentCID, parentHint: name + ".vmdk",
		extents: []string{fmt.Sprintf(`RW %d SESPARSE "%s-000001-sesparse.vmdk"`, capacity/512, name)},
		ddb:     [][2]string{{"ddb.grain", "8"}},
	}
	_ = os.WriteFile(stem+"-000001.vmdk", []byte(desc.text()), 0o600)
}
