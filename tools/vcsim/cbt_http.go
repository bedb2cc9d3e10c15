package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// The lab's hands on a running source VM (-cbt): a guest that writes into its disk while it is migrated, the
// disk as the guest sees it (the oracle at power-off), a CBT reset, and file locks on /folder.
const (
	guestDiskPath = "/ferry-lab/disk"
	cbtResetPath  = "/ferry-lab/cbt-reset"
	folderLockAt  = "/ferry-lab/folder-lock"
)

// guestDisk is what GET /ferry-lab/disk answers.
type guestDisk struct {
	Key      int32  `json:"key"`
	Capacity int64  `json:"capacity"`
	Sha256   string `json:"sha256"`
	ChangeID string `json:"changeId"`
	// Snapshot: whether the disk runs on an active layer over a frozen base
	Snapshot bool `json:"snapshot"`
}

// guestDiskHandler serves PUT /ferry-lab/disk?vm=NAME&disk=KEY&offset=N (the body is written where the guest
// would write it; refused while the VM is off) and GET /ferry-lab/disk?vm=NAME&disk=KEY. Without disk=, the
// VM's first disk.
func (s *sim) guestDiskHandler(rw http.ResponseWriter, r *http.Request) {
	c := s.cbt
	if c == nil {
		http.Error(rw, "the lab vCenter runs without -cbt", http.StatusNotFound)
		return
	}
	ctx := s.model.Service.Context
	q := r.URL.Query()
	vm := findVM(ctx, q.Get("vm"))
	if vm == nil {
		http.Error(rw, fmt.Sprintf("no VM named %q", q.Get("vm")), http.StatusNotFound)
		return
	}
	key, err := diskKey(vm, q.Get("disk"))
	if err != nil {
		http.Error(rw, err.Error(), http.StatusNotFound)
		return
	}
	switch r.Method {
	case http.MethodPut:
		offset, err := strconv.ParseInt(q.Get("offset"), 10, 64)
		if err != nil {
			http.Error(rw, "offset= wants a byte offset", http.StatusBadRequest)
			return
		}
		data, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
			http.Error(rw, vm.Name+" is not running: no guest writes", http.StatusConflict)
			return
		}
		c.mu.Lock()
		d, err := c.disk(ctx, vm, key)
		if err == nil {
			err = d.write(offset, data)
		}
		c.mu.Unlock()
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		rw.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		c.mu.Lock()
		d, err := c.disk(ctx, vm, key)
		var out guestDisk
		if err == nil {
			out = guestDisk{Key: key, Capacity: d.capacity, ChangeID: d.changeID(), Snapshot: d.layer != nil}
			out.Sha256, err = d.sha256()
		}
		c.mu.Unlock()
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(out)
	default:
		http.Error(rw, "PUT or GET", http.StatusMethodNotAllowed)
	}
}

// cbtResetHandler serves POST /ferry-lab/cbt-reset?vm=NAME: the VM's tracking restarts in a new epoch (what
// disabling and enabling CBT across two stuns does), so every change ID handed out before is invalid.
func (s *sim) cbtResetHandler(rw http.ResponseWriter, r *http.Request) {
	c := s.cbt
	if c == nil || r.Method != http.MethodPost {
		http.Error(rw, "POST, with -cbt", http.StatusNotFound)
		return
	}
	ctx := s.model.Service.Context
	vm := findVM(ctx, r.URL.Query().Get("vm"))
	if vm == nil {
		http.Error(rw, "no such VM", http.StatusNotFound)
		return
	}
	ctx.WithLock(vm, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, disk := range vmDisks(vm) {
			if d, err := c.disk(ctx, vm, disk.Key); err == nil && d.state != trackingOff {
				d.start()
				setChangeID(disk.Backing, d.changeID())
			}
		}
	})
	rw.WriteHeader(http.StatusNoContent)
}

func findVM(ctx *simulator.Context, name string) *simulator.VirtualMachine {
	for _, e := range ctx.Map.All("VirtualMachine") {
		if vm := e.(*simulator.VirtualMachine); vm.Name == name {
			return vm
		}
	}
	return nil
}

func diskKey(vm *simulator.VirtualMachine, text string) (int32, error) {
	disks := vmDisks(vm)
	if text == "" {
		if len(disks) == 0 {
			return 0, fmt.Errorf("%s has no disk", vm.Name)
		}
		return disks[0].Key, nil
	}
	key, err := strconv.ParseInt(text, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("disk= wants a device key: %q", text)
	}
	return int32(key), nil
}

// folderLock says which flat files /folder refuses to read, as ESXi refuses a file a running VM holds open
// (reported on vCenter 8.0.3: HTTP 500 for a running VM's flat; readable once a snapshot froze it).
type folderLock int32

const (
	lockNone folderLock = iota
	// lockRunning: a running VM's flat files it writes to (no snapshot over them)
	lockRunning
	// lockBase: also the frozen base under a running VM's snapshot
	lockBase
)

func parseFolderLock(text string) (folderLock, error) {
	switch text {
	case "", "off":
		return lockNone, nil
	case "running":
		return lockRunning, nil
	case "base":
		return lockBase, nil
	}
	return 0, fmt.Errorf("folder lock %q: want off, running or base", text)
}

// folderLockHandler serves PUT /ferry-lab/folder-lock?mode=off|running|base.
func (s *sim) folderLockHandler(rw http.ResponseWriter, r *http.Request) {
	mode, err := parseFolderLock(r.URL.Query().Get("mode"))
	if err != nil || r.Method != http.MethodPut {
		http.Error(rw, fmt.Sprintf("PUT ?mode=off|running|base (%v)", err), http.StatusBadRequest)
		return
	}
	s.folder.lock.Store(int32(mode))
	rw.WriteHeader(http.StatusNoContent)
}

// lockedFlat says whether a running VM holds the file at /folder/<path>?dsName=<ds> under mode.
func lockedFlat(ctx *simulator.Context, mode folderLock, ds, path string) bool {
	if mode == lockNone || !strings.HasSuffix(path, "-flat.vmdk") {
		return false
	}
	want := fmt.Sprintf("[%s] %s", ds, strings.TrimSuffix(path, "-flat.vmdk")+".vmdk")
	for _, e := range ctx.Map.All("VirtualMachine") {
		vm := e.(*simulator.VirtualMachine)
		if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
			continue
		}
		for _, disk := range vmDisks(vm) {
			switch b := disk.Backing.(type) {
			case *types.VirtualDiskFlatVer2BackingInfo:
				if b.FileName == want {
					return true
				}
			case *types.VirtualDiskSeSparseBackingInfo:
				if mode == lockBase && b.Parent != nil && b.Parent.FileName == want {
					return true
				}
			}
		}
	}
	return false
}

// folderPath reads /folder/<path>?dsName=<ds> back into the datastore and the path in it.
func folderPath(u *url.URL) (ds, path string) {
	p, err := url.PathUnescape(strings.TrimPrefix(u.EscapedPath(), "/folder/"))
	if err != nil {
		p = strings.TrimPrefix(u.Path, "/folder/")
	}
	return u.Query().Get("dsName"), p
}
