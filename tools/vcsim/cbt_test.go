package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

func TestChangedPageCoalescesPagesAndWindows(t *testing.T) {
	const capacity = 10*cbtBlock + 1000 // the last block is short
	s := newBlockSet(capacity)
	for _, b := range []int64{0, 1, 2, 5, 10} {
		s.add(b)
	}
	p := changedPage(s, capacity, 0, 0, 0)
	want := []area{{0, 3 * cbtBlock}, {5 * cbtBlock, cbtBlock}, {10 * cbtBlock, 1000}}
	if fmt.Sprint(p.areas) != fmt.Sprint(want) || p.length != capacity {
		t.Fatalf("one page: %+v", p)
	}
	// Two areas per page: the page ends at its last area, the next starts there.
	p = changedPage(s, capacity, 0, 2, 0)
	if len(p.areas) != 2 || p.length != 6*cbtBlock {
		t.Fatalf("first of pages: %+v", p)
	}
	p = changedPage(s, capacity, p.start+p.length, 2, 0)
	if len(p.areas) != 1 || p.areas[0] != (area{10 * cbtBlock, 1000}) || p.start+p.length != capacity {
		t.Fatalf("second of pages: %+v", p)
	}
	// A window without changes is an empty page short of the end, not the end.
	p = changedPage(s, capacity, 6*cbtBlock, 0, 2*cbtBlock)
	if len(p.areas) != 0 || p.length != 2*cbtBlock {
		t.Fatalf("empty window: %+v", p)
	}
	// A query from inside an area starts the area there.
	p = changedPage(s, capacity, cbtBlock+512, 1, 0)
	if p.areas[0] != (area{cbtBlock + 512, 2*cbtBlock - 512}) {
		t.Fatalf("from inside: %+v", p)
	}
}

func TestChangeIDsAreParsedAndPrintedAsESXi(t *testing.T) {
	epoch := ctkEpoch()
	if len(epoch) != 47 || epoch[23] != '-' || strings.Count(epoch, " ") != 14 {
		t.Fatalf("epoch %q", epoch)
	}
	p, ok := parseChangeID(epoch + "/81")
	if !ok || p.epoch != epoch || p.stun != 81 {
		t.Fatalf("parsed %+v", p)
	}
	for _, bad := range []string{"", "*", "abc", "/3", epoch + "/-1", epoch + "/x"} {
		if _, ok := parseChangeID(bad); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// cbtLab is a simulator with -cbt and a logged-in client on its first VM.
type cbtLab struct {
	*testSim
	c    *govmomi.Client
	vm   *object.VirtualMachine
	name string
	key  int32
}

func startCBT(t *testing.T, r realism) *cbtLab {
	r.cbt = true
	if r.cbtMaxAreas == 0 {
		r.cbtMaxAreas = 2000
	}
	s := startSim(t, r)
	c := s.login()
	vm, err := find.NewFinder(c.Client).VirtualMachine(context.Background(), "DC0_H0_VM0")
	if err != nil {
		t.Fatal(err)
	}
	l := &cbtLab{testSim: s, c: c, vm: vm, name: "DC0_H0_VM0"}
	// vcsim's disks are 10 GiB; the tests hash whole disks, so theirs is smaller.
	ctx := s.model.Service.Context
	sv := ctx.Map.Get(vm.Reference()).(*simulator.VirtualMachine)
	ctx.WithLock(sv, func() {
		disk := vmDisks(sv)[0]
		disk.CapacityInBytes, disk.CapacityInKB = testDiskBytes, testDiskBytes>>10
		l.key = disk.Key
	})
	return l
}

const testDiskBytes = 64 << 20

func (l *cbtLab) disks(ref types.ManagedObjectReference) []*types.VirtualDisk {
	l.t.Helper()
	var props []types.BaseVirtualDevice
	if ref.Type == "VirtualMachine" {
		var vm mo.VirtualMachine
		if err := l.vm.Properties(context.Background(), ref, []string{"config.hardware.device"}, &vm); err != nil {
			l.t.Fatal(err)
		}
		props = vm.Config.Hardware.Device
	} else {
		var snap mo.VirtualMachineSnapshot
		if err := l.vm.Properties(context.Background(), ref, []string{"config.hardware.device"}, &snap); err != nil {
			l.t.Fatal(err)
		}
		props = snap.Config.Hardware.Device
	}
	var disks []*types.VirtualDisk
	for _, d := range props {
		if disk, ok := d.(*types.VirtualDisk); ok {
			disks = append(disks, disk)
		}
	}
	return disks
}

func changeID(disk *types.VirtualDisk) string {
	switch b := disk.Backing.(type) {
	case *types.VirtualDiskFlatVer2BackingInfo:
		return b.ChangeId
	case *types.VirtualDiskSeSparseBackingInfo:
		return b.ChangeId
	}
	return ""
}

func (l *cbtLab) write(offset int64, data []byte) {
	l.t.Helper()
	u := fmt.Sprintf("https://%s%s?vm=%s&offset=%d", l.server.URL.Host, guestDiskPath, l.name, offset)
	if resp, body, _ := l.do(http.MethodPut, u, nil, data); resp.StatusCode != http.StatusNoContent {
		l.t.Fatalf("guest write at %d: %s %s", offset, resp.Status, body)
	}
}

func (l *cbtLab) guestDisk() guestDisk {
	l.t.Helper()
	u := fmt.Sprintf("https://%s%s?vm=%s", l.server.URL.Host, guestDiskPath, l.name)
	body := l.expectStatus(http.MethodGet, u, nil, http.StatusOK)
	var g guestDisk
	if err := json.Unmarshal(body, &g); err != nil {
		l.t.Fatal(err)
	}
	return g
}

// query asks one page; fault is the fault's type name ("" when it answered).
func (l *cbtLab) query(snapshot *types.ManagedObjectReference, start int64, id string) (types.DiskChangeInfo, string) {
	l.t.Helper()
	req := types.QueryChangedDiskAreas{This: l.vm.Reference(), Snapshot: snapshot, DeviceKey: l.key, StartOffset: start, ChangeId: id}
	res, err := methods.QueryChangedDiskAreas(context.Background(), l.c.Client, &req)
	if err != nil {
		if soap.IsSoapFault(err) {
			return types.DiskChangeInfo{}, fmt.Sprintf("%T", soap.ToSoapFault(err).VimFault())
		}
		l.t.Fatal(err)
	}
	return res.Returnval, ""
}

// changed pages a query to the disk's end and returns every area.
func (l *cbtLab) changed(snapshot *types.ManagedObjectReference, id string, capacity int64) (areas []types.DiskChangeExtent, pages int) {
	l.t.Helper()
	for start := int64(0); start < capacity; pages++ {
		info, fault := l.query(snapshot, start, id)
		if fault != "" {
			l.t.Fatalf("query from %d: %s", start, fault)
		}
		if info.Length <= 0 {
			l.t.Fatalf("an empty page at %d", start)
		}
		areas = append(areas, info.ChangedArea...)
		start = info.StartOffset + info.Length
	}
	return areas, pages
}

func (l *cbtLab) snapshot(name string) types.ManagedObjectReference {
	l.t.Helper()
	task, err := l.vm.CreateSnapshot(context.Background(), name, "", false, false)
	if err != nil {
		l.t.Fatal(err)
	}
	info, err := task.WaitForResult(context.Background())
	if err != nil {
		l.t.Fatal(err)
	}
	return info.Result.(types.ManagedObjectReference)
}

func (l *cbtLab) removeSnapshot(ref types.ManagedObjectReference) {
	l.t.Helper()
	consolidate := true
	req := types.RemoveSnapshot_Task{This: ref, RemoveChildren: false, Consolidate: &consolidate}
	res, err := methods.RemoveSnapshot_Task(context.Background(), l.c.Client, &req)
	if err == nil {
		err = object.NewTask(l.c.Client, res.Returnval).Wait(context.Background())
	}
	if err != nil {
		l.t.Fatal(err)
	}
}

func (l *cbtLab) reconfigure(spec types.VirtualMachineConfigSpec) {
	l.t.Helper()
	task, err := l.vm.Reconfigure(context.Background(), spec)
	if err == nil {
		err = task.Wait(context.Background())
	}
	if err != nil {
		l.t.Fatal(err)
	}
}

func fill(n int, b byte) []byte { return []byte(strings.Repeat(string([]byte{b}), n)) }

func TestCBTFollowsStunsAndSnapshotsFreezeTheBase(t *testing.T) {
	l := startCBT(t, realism{})
	ctx := context.Background()
	if _, fault := l.query(nil, 0, "*"); fault != "types.InvalidArgument" {
		t.Fatalf("before tracking: %q", fault)
	}
	// Turned on while running: pending until a stun, no change ID yet.
	on := true
	l.reconfigure(types.VirtualMachineConfigSpec{ChangeTrackingEnabled: &on})
	if id := changeID(l.disks(l.vm.Reference())[0]); id != "" {
		t.Fatalf("a change ID before the stun: %q", id)
	}
	g := l.guestDisk()
	capacity := g.Capacity
	l.write(0, fill(100, 'a'))
	l.write(3*cbtBlock, fill(cbtBlock, 'b'))

	s1 := l.snapshot("ferry-1")
	id1 := changeID(l.disks(s1)[0])
	if p, ok := parseChangeID(id1); !ok || p.stun != 0 {
		t.Fatalf("the first snapshot's change ID: %q", id1)
	}
	live := l.disks(l.vm.Reference())[0]
	delta, ok := live.Backing.(*types.VirtualDiskSeSparseBackingInfo)
	base := l.disks(s1)[0].Backing.(*types.VirtualDiskFlatVer2BackingInfo)
	if !ok || !strings.HasSuffix(delta.FileName, "-000001.vmdk") || delta.Parent.FileName != base.FileName {
		t.Fatalf("the running VM's disk on a snapshot: %#v", live.Backing)
	}
	// "*": what the base holds; nothing without a snapshot while the VM runs.
	areas, _ := l.changed(&s1, "*", capacity)
	if fmt.Sprint(areas) != fmt.Sprint([]types.DiskChangeExtent{{Start: 0, Length: cbtBlock}, {Start: 3 * cbtBlock, Length: cbtBlock}}) {
		t.Fatalf("allocated: %+v", areas)
	}
	if _, fault := l.query(nil, 0, id1); fault != "types.FileFault" {
		t.Fatalf("no snapshot while running: %q", fault)
	}

	// Writes during the snapshot land in the layer: the guest sees them, the base does not change.
	baseSum := l.fileSum(base.FileName)
	l.write(5*cbtBlock+10, fill(20, 'c'))
	l.write(3*cbtBlock, fill(10, 'd'))
	if l.fileSum(base.FileName) != baseSum {
		t.Fatal("a guest write reached the frozen base")
	}
	want := make([]byte, capacity)
	copy(want, fill(100, 'a'))
	copy(want[3*cbtBlock:], fill(cbtBlock, 'b'))
	copy(want[5*cbtBlock+10:], fill(20, 'c'))
	copy(want[3*cbtBlock:], fill(10, 'd'))
	if got := l.guestDisk(); got.Sha256 != sum(want) || !got.Snapshot {
		t.Fatalf("the guest's disk: %+v", got)
	}
	p1, _ := parseChangeID(id1)
	if _, fault := l.query(&s1, 0, fmt.Sprintf("%s/%d", p1.epoch, p1.stun+5)); fault != "types.InvalidArgument" {
		t.Fatalf("a change ID past the snapshot: %q", fault)
	}
	// Removal consolidates: the base is the guest's disk; the disk is flat again with the next change ID.
	l.removeSnapshot(s1)
	if l.fileSum(base.FileName) != sum(want) {
		t.Fatal("consolidation lost a write")
	}
	live = l.disks(l.vm.Reference())[0]
	if _, flat := live.Backing.(*types.VirtualDiskFlatVer2BackingInfo); !flat || changeID(live) == id1 {
		t.Fatalf("after removal: %#v", live.Backing)
	}
	if _, fault := l.query(&s1, 0, id1); fault != "types.NotFound" {
		t.Fatalf("a removed snapshot: %q", fault)
	}
	l.write(9*cbtBlock, fill(1, 'e')) // between the removal and the next snapshot

	s2 := l.snapshot("ferry-2")
	areas, _ = l.changed(&s2, id1, capacity)
	wantAreas := []types.DiskChangeExtent{{Start: 3 * cbtBlock, Length: cbtBlock}, {Start: 5 * cbtBlock, Length: cbtBlock}, {Start: 9 * cbtBlock, Length: cbtBlock}}
	if fmt.Sprint(areas) != fmt.Sprint(wantAreas) {
		t.Fatalf("changes between the snapshots: %+v", areas)
	}
	other := ctkEpoch() + "/0"
	if _, fault := l.query(&s2, 0, other); fault != "types.InvalidArgument" {
		t.Fatalf("another epoch's ID: %q", fault)
	}
	if _, fault := l.query(&s2, capacity, id1); fault != "types.InvalidArgument" {
		t.Fatalf("startOffset at the end: %q", fault)
	}

	// A reset invalidates every ID handed out, the snapshot's too.
	l.expectStatus(http.MethodPost, fmt.Sprintf("https://%s%s?vm=%s", l.server.URL.Host, cbtResetPath, l.name), nil, http.StatusNoContent)
	if _, fault := l.query(&s2, 0, id1); fault != "types.InvalidArgument" {
		t.Fatalf("after a reset: %q", fault)
	}
	l.removeSnapshot(s2)
	id3 := changeID(l.disks(l.vm.Reference())[0])

	// Off: a query without a snapshot reaches up to now; guests do not write.
	l.write(7*cbtBlock, fill(1, 'f'))
	if err := wait(l.vm.PowerOff(ctx)); err != nil {
		t.Fatal(err)
	}
	areas, _ = l.changed(nil, id3, capacity)
	if fmt.Sprint(areas) != fmt.Sprint([]types.DiskChangeExtent{{Start: 7 * cbtBlock, Length: cbtBlock}}) {
		t.Fatalf("powered off, up to now: %+v", areas)
	}
	u := fmt.Sprintf("https://%s%s?vm=%s&offset=0", l.server.URL.Host, guestDiskPath, l.name)
	if resp, _, _ := l.do(http.MethodPut, u, nil, []byte("x")); resp.StatusCode != http.StatusConflict {
		t.Fatalf("a write while off: %s", resp.Status)
	}
}

func TestCBTTurnedOnWhileOffTracksAtOnceAndPowerOnIsAStun(t *testing.T) {
	l := startCBT(t, realism{})
	ctx := context.Background()
	if err := wait(l.vm.PowerOff(ctx)); err != nil {
		t.Fatal(err)
	}
	on := true
	l.reconfigure(types.VirtualMachineConfigSpec{ChangeTrackingEnabled: &on})
	id := changeID(l.disks(l.vm.Reference())[0])
	if p, ok := parseChangeID(id); !ok || p.stun != 0 {
		t.Fatalf("turned on while off: %q", id)
	}
	if err := wait(l.vm.PowerOn(ctx)); err != nil {
		t.Fatal(err)
	}
	if next := changeID(l.disks(l.vm.Reference())[0]); next == id || !strings.HasSuffix(next, "/1") {
		t.Fatalf("after power on: %q (was %q)", next, id)
	}
	off := false
	l.reconfigure(types.VirtualMachineConfigSpec{ChangeTrackingEnabled: &off})
	if id := changeID(l.disks(l.vm.Reference())[0]); id != "" {
		t.Fatalf("turned off: %q", id)
	}
}

func TestCBTPagesManyAreasAndEmptyWindows(t *testing.T) {
	l := startCBT(t, realism{cbtMaxAreas: 100, cbtWindow: 256 * cbtBlock})
	on := true
	l.reconfigure(types.VirtualMachineConfigSpec{ChangeTrackingEnabled: &on})
	s1 := l.snapshot("ferry-1")
	id1 := changeID(l.disks(s1)[0])
	l.removeSnapshot(s1)
	capacity := l.guestDisk().Capacity
	// Every other block of the first 600, then the last block: 301 areas, in windows of 256 blocks (the first
	// two cut at 100 areas), then windows with none.
	var want []types.DiskChangeExtent
	for i := int64(0); i < 300; i++ {
		l.write(2*i*cbtBlock, []byte{1})
		want = append(want, types.DiskChangeExtent{Start: 2 * i * cbtBlock, Length: cbtBlock})
	}
	last := (capacity/cbtBlock - 1) * cbtBlock
	l.write(last, []byte{2})
	want = append(want, types.DiskChangeExtent{Start: last, Length: min(cbtBlock, capacity-last)})
	s2 := l.snapshot("ferry-2")
	areas, pages := l.changed(&s2, id1, capacity)
	if fmt.Sprint(areas) != fmt.Sprint(want) {
		t.Fatalf("%d areas, want %d", len(areas), len(want))
	}
	// In blocks: [0,199) and [199,399) cut at 100 areas, [399,599) at its 100th, [599,855) empty, [855,1024).
	if pages != 5 {
		t.Fatalf("%d pages", pages)
	}
	info, _ := l.query(&s2, 0, id1)
	if len(info.ChangedArea) != 100 || info.Length != 199*cbtBlock {
		t.Fatalf("the first page: %d areas, length %d", len(info.ChangedArea), info.Length)
	}
	info, _ = l.query(&s2, 700*cbtBlock, id1)
	if len(info.ChangedArea) != 0 || info.Length != 256*cbtBlock {
		t.Fatalf("an empty window: %d areas, length %d", len(info.ChangedArea), info.Length)
	}
}

func TestFolderLockRefusesFilesARunningVMHolds(t *testing.T) {
	l := startCBT(t, realism{folderLock: "running"})
	ctx := context.Background()
	disk := l.disks(l.vm.Reference())[0].Backing.(*types.VirtualDiskFlatVer2BackingInfo)
	ds, rel, _ := strings.Cut(strings.TrimPrefix(disk.FileName, "["), "] ")
	flat := l.folderURL("DC0", ds, strings.TrimSuffix(rel, ".vmdk")+"-flat.vmdk")
	desc := l.folderURL("DC0", ds, rel)
	l.expectStatus(http.MethodGet, flat, l.cookie(l.c), http.StatusInternalServerError)
	l.expectStatus(http.MethodGet, desc, l.cookie(l.c), http.StatusOK)
	s := l.snapshot("ferry-1")
	l.expectStatus(http.MethodGet, flat, l.cookie(l.c), http.StatusOK) // frozen under a snapshot
	setLock := func(mode string) {
		u := fmt.Sprintf("https://%s%s?mode=%s", l.server.URL.Host, folderLockAt, mode)
		l.expectStatus(http.MethodPut, u, nil, http.StatusNoContent)
	}
	setLock("base")
	l.expectStatus(http.MethodHead, flat, l.cookie(l.c), http.StatusInternalServerError)
	l.removeSnapshot(s)
	if err := wait(l.vm.PowerOff(ctx)); err != nil {
		t.Fatal(err)
	}
	l.expectStatus(http.MethodGet, flat, l.cookie(l.c), http.StatusOK)
	setLock("off")
	if err := wait(l.vm.PowerOn(ctx)); err != nil {
		t.Fatal(err)
	}
	l.expectStatus(http.MethodGet, flat, l.cookie(l.c), http.StatusOK)
}

// fileSum hashes a datastore file as /folder serves it.
func (l *cbtLab) fileSum(datastorePath string) string {
	l.t.Helper()
	ds, rel, _ := strings.Cut(strings.TrimPrefix(datastorePath, "["), "] ")
	u := l.folderURL("DC0", ds, strings.TrimSuffix(rel, ".vmdk")+"-flat.vmdk")
	body := l.expectStatus(http.MethodGet, u, l.cookie(l.c), http.StatusOK)
	capacity := l.guestDisk().Capacity
	if int64(len(body)) < capacity {
		body = append(body, make([]byte, capacity-int64(len(body)))...)
	}
	return sum(body)
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
