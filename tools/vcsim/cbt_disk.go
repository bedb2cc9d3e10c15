package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

// The data of the CBT model's disks: the base flat file on the datastore, and while a snapshot exists a private
// active layer that takes the guest's writes (copy-on-write per 64 KiB block) until consolidation.

// disk is the model's record of a VM's disk, made on first use. Call with c.mu held.
func (c *cbtModel) disk(ctx *simulator.Context, vm *simulator.VirtualMachine, key int32) (*cbtDisk, error) {
	ref := diskRef{vm: vm.Self, key: key}
	if d, ok := c.disks[ref]; ok {
		return d, nil
	}
	for _, disk := range vmDisks(vm) {
		if disk.Key != key {
			continue
		}
		file, ok := disk.Backing.(types.BaseVirtualDeviceFileBackingInfo)
		if !ok {
			return nil, fmt.Errorf("disk %d of %s has no file backing", key, vm.Name)
		}
		base, err := localFlat(ctx, file.GetVirtualDeviceFileBackingInfo().FileName)
		if err != nil {
			return nil, err
		}
		capacity := disk.CapacityInBytes
		if capacity == 0 {
			capacity = disk.CapacityInKB << 10
		}
		d := &cbtDisk{capacity: capacity, base: base}
		if vm.Config.ChangeTrackingEnabled != nil && *vm.Config.ChangeTrackingEnabled {
			d.state = trackingPending
		}
		c.disks[ref] = d
		return d, nil
	}
	return nil, fmt.Errorf("%s has no disk %d", vm.Name, key)
}

// localFlat is the local path of the flat extent of the descriptor at a datastore path ("[ds] dir/x.vmdk" has
// its data in dir/x-flat.vmdk, as vcsim and the lab write monolithicFlat disks).
func localFlat(ctx *simulator.Context, datastorePath string) (string, error) {
	ds, rel, ok := strings.Cut(strings.TrimPrefix(datastorePath, "["), "] ")
	if !ok || !strings.HasSuffix(rel, ".vmdk") {
		return "", fmt.Errorf("not a datastore path of a .vmdk: %q", datastorePath)
	}
	for _, e := range ctx.Map.All("Datastore") {
		if d := e.(*simulator.Datastore); d.Name == ds {
			return filepath.Join(d.Summary.Url, strings.TrimSuffix(rel, ".vmdk")+"-flat.vmdk"), nil
		}
	}
	return "", fmt.Errorf("no datastore %q", ds)
}

// write is a guest write into the disk's active layer.
func (d *cbtDisk) write(offset int64, data []byte) error {
	if offset < 0 || offset+int64(len(data)) > d.capacity {
		return fmt.Errorf("[%d, %d) is outside the disk (%d bytes)", offset, offset+int64(len(data)), d.capacity)
	}
	if d.layer == nil {
		if err := unshare(d.base); err != nil {
			return err
		}
		f, err := os.OpenFile(d.base, os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		_, err = f.WriteAt(data, offset)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	} else {
		for b := offset / cbtBlock; b*cbtBlock < offset+int64(len(data)); b++ {
			if err := d.copyUp(b); err != nil {
				return err
			}
		}
		if _, err := d.layer.WriteAt(data, offset); err != nil {
			return err
		}
	}
	d.wrote(offset, int64(len(data)))
	return nil
}

// copyUp brings block b of the base into the active layer before its first write there.
func (d *cbtDisk) copyUp(b int64) error {
	if d.layerBlocks.has(b) {
		return nil
	}
	buf := make([]byte, min(cbtBlock, d.capacity-b*cbtBlock))
	if err := readBase(d.base, buf, b*cbtBlock); err != nil {
		return err
	}
	if _, err := d.layer.WriteAt(buf, b*cbtBlock); err != nil {
		return err
	}
	d.layerBlocks.add(b)
	return nil
}

// readBase reads the base at offset; what lies past its end (a thin file shorter than the disk) reads as zeros.
func readBase(path string, buf []byte, offset int64) error {
	clear(buf)
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(buf, offset); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// unshare gives a hard-linked base (the lab links cached guest images into the datastore) a file of its own,
// so a guest write never reaches the cache.
func unshare(path string) error {
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Nlink <= 1 {
		return nil
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := path + ".unshare"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode())
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// openLayer starts an active layer over the frozen base (a snapshot was taken).
func (d *cbtDisk) openLayer(dir string, ref diskRef) error {
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.layer", ref.vm.Value, ref.key)))
	if err != nil {
		return err
	}
	d.layer, d.layerBlocks = f, newBlockSet(d.capacity)
	return nil
}

// consolidate writes the active layer's blocks into the base and drops the layer (the snapshot was removed).
func (d *cbtDisk) consolidate() error {
	if d.layer == nil {
		return nil
	}
	if err := unshare(d.base); err != nil {
		return err
	}
	base, err := os.OpenFile(d.base, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, cbtBlock)
	for b := int64(0); b*cbtBlock < d.capacity; b++ {
		if !d.layerBlocks.has(b) {
			continue
		}
		n := min(cbtBlock, d.capacity-b*cbtBlock)
		if _, err = d.layer.ReadAt(buf[:n], b*cbtBlock); err != nil && err != io.EOF {
			break
		}
		if _, err = base.WriteAt(buf[:n], b*cbtBlock); err != nil {
			break
		}
		err = nil
	}
	if cerr := base.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	name := d.layer.Name()
	d.layer.Close()
	d.layer, d.layerBlocks = nil, nil
	return os.Remove(name)
}

// sha256 hashes what the guest sees: the base under the active layer, to the disk's capacity.
func (d *cbtDisk) sha256() (string, error) {
	h := sha256.New()
	buf := make([]byte, cbtBlock)
	for b := int64(0); b*cbtBlock < d.capacity; b++ {
		n := min(cbtBlock, d.capacity-b*cbtBlock)
		if d.layer != nil && d.layerBlocks.has(b) {
			if _, err := d.layer.ReadAt(buf[:n], b*cbtBlock); err != nil && err != io.EOF {
				return "", err
			}
		} else if err := readBase(d.base, buf[:n], b*cbtBlock); err != nil {
			return "", err
		}
		h.Write(buf[:n])
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// allocated: the blocks of the base that hold data (SEEK_DATA), what a query with changeId "*" reports.
func (d *cbtDisk) allocated() (blockSet, error) {
	s := newBlockSet(d.capacity)
	f, err := os.Open(d.base)
	if os.IsNotExist(err) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	const seekData, seekHole = 3, 4
	for off := int64(0); off < d.capacity; {
		data, err := f.Seek(off, seekData)
		if err != nil || data >= d.capacity { // ENXIO: no data after off
			break
		}
		hole, err := f.Seek(data, seekHole)
		if err != nil {
			return nil, err
		}
		hole = min(hole, d.capacity)
		if hole > data {
			s.addRange(data, hole-data)
		}
		off = hole
	}
	return s, nil
}
