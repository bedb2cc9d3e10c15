package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// cbtModel is the lab's model of Changed Block Tracking and snapshot layers (-cbt), which vcsim lacks: it only
// stores changeTrackingEnabled. Per disk it keeps change IDs ("<ctk uuid>/<stun>"), the blocks written
// between stuns (the lab's guest writes them through /ferry-lab/disk), and, while a snapshot exists, a private
// active layer over the frozen base flat file, consolidated into it when the snapshot goes.
//
// vSphere's rules it follows (vim25 types.go on VirtualMachineConfigSpec.changeTrackingEnabled and
// QueryChangedDiskAreas): tracking turned on takes effect at the next stun (power on, snapshot create or
// remove), at once on a powered-off VM; each stun starts a new change ID; a snapshot's disks carry the ID of the
// stun that took it; a query gives the areas written since an earlier ID of the same tracking epoch, up to a
// snapshot, or up to now only while the VM is off.
type cbtModel struct {
	mu       sync.Mutex
	home     string // the active layers' files: never on a datastore, so /folder cannot serve them
	maxAreas int    // areas per answer (ESXi: about 2,000)
	window   int64  // bytes of disk per answer (0: the rest of the disk)
	disks    map[diskRef]*cbtDisk
	// snapshots: each layered snapshot's change point per disk key
	snapshots map[types.ManagedObjectReference]layeredSnapshot
	// power: each VM's power state as the model last saw it (a power-on is a stun)
	power map[types.ManagedObjectReference]types.VirtualMachinePowerState
}

type diskRef struct {
	vm  types.ManagedObjectReference
	key int32
}

// changePoint is a change ID: a tracking epoch and a stun within it.
type changePoint struct {
	epoch string
	stun  int
}

func (p changePoint) String() string { return fmt.Sprintf("%s/%d", p.epoch, p.stun) }

// trackingState of one disk.
type trackingState int

const (
	trackingOff     trackingState = iota
	trackingPending               // enabled, waiting for a stun
	trackingActive
)

// cbtDisk is one virtual disk's tracking and layers.
type cbtDisk struct {
	capacity int64
	base     string // the flat file (local path) the disk's data lives in without a snapshot
	state    trackingState
	now      changePoint // the last stun
	// written[k]: blocks written between stun k and stun k+1 of the current epoch
	written []blockSet
	// layer: the active layer's file and blocks while a snapshot exists (nil without one)
	layer       *os.File
	layerBlocks blockSet
	// flat: the disk's own backing while the VM shows it on a delta
	flat *types.VirtualDiskFlatVer2BackingInfo
}

func newCBTModel(maxAreas int, window int64) (*cbtModel, error) {
	home, err := os.MkdirTemp("", "ferry-cbt-")
	if err != nil {
		return nil, err
	}
	return &cbtModel{
		home: home, maxAreas: maxAreas, window: window, disks: map[diskRef]*cbtDisk{},
		snapshots: map[types.ManagedObjectReference]layeredSnapshot{},
		power:     map[types.ManagedObjectReference]types.VirtualMachinePowerState{},
	}, nil
}

func (c *cbtModel) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.disks {
		if d.layer != nil {
			d.layer.Close()
		}
	}
	os.RemoveAll(c.home)
}

// stun is what a stun does to a disk's tracking: a pending one starts a new epoch, an active one a new ID.
func (d *cbtDisk) stun() {
	switch d.state {
	case trackingPending:
		d.start()
	case trackingActive:
		d.now.stun++
		d.written = append(d.written, newBlockSet(d.capacity))
	}
}

// start begins a new tracking epoch: every earlier change ID is invalid from now on.
func (d *cbtDisk) start() {
	d.state = trackingActive
	d.now = changePoint{epoch: ctkEpoch(), stun: 0}
	d.written = []blockSet{newBlockSet(d.capacity)}
}

// ctkEpoch is a new change-tracking identity, in the form ESXi prints it ("52 de c0 d9 b9 43 9d 10-61 d5 4c
// 1b e9 7b 65 63").
func ctkEpoch() string {
	u := uuid.New()
	var b strings.Builder
	for i, x := range u {
		switch {
		case i == 8:
			b.WriteByte('-')
		case i > 0:
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%02x", x)
	}
	return b.String()
}

// parseChangeID reads "<epoch>/<stun>".
func parseChangeID(id string) (changePoint, bool) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return changePoint{}, false
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 0 {
		return changePoint{}, false
	}
	return changePoint{epoch: id[:i], stun: n}, true
}

// changedSince: the blocks written from point `from` up to stun `to` (exclusive), or nil when `from` is not a
// point of the disk's current epoch at or before `to`.
func (d *cbtDisk) changedSince(from changePoint, to int) blockSet {
	if d.state != trackingActive || from.epoch != d.now.epoch || from.stun > to || to > len(d.written) {
		return nil
	}
	s := newBlockSet(d.capacity)
	for _, w := range d.written[from.stun:to] {
		s.union(w)
	}
	return s
}

// wrote records a guest write in the tracking.
func (d *cbtDisk) wrote(offset, length int64) {
	if d.state == trackingActive {
		d.written[d.now.stun].addRange(offset, length)
	}
}

// vmDisks lists a VM's virtual disks.
func vmDisks(vm *simulator.VirtualMachine) []*types.VirtualDisk {
	var disks []*types.VirtualDisk
	for _, dev := range vm.Config.Hardware.Device {
		if disk, ok := dev.(*types.VirtualDisk); ok {
			disks = append(disks, disk)
		}
	}
	return disks
}

// setChangeID writes id into a disk backing that carries one ("" clears it).
func setChangeID(backing types.BaseVirtualDeviceBackingInfo, id string) {
	switch b := backing.(type) {
	case *types.VirtualDiskFlatVer2BackingInfo:
		b.ChangeId = id
	case *types.VirtualDiskSeSparseBackingInfo:
		b.ChangeId = id
	case *types.VirtualDiskSparseVer2BackingInfo:
		b.ChangeId = id
	}
}
