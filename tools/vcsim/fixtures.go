package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/uuid"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/types"
)

// The fixture VMs: each has one disk Ferry must refuse, shaped as vSphere reports it, and is powered on.
const (
	vsanVM        = "ferry-vsan-vm"
	vvolVM        = "ferry-vvol-vm"
	encryptedVM   = "ferry-encrypted-vm"
	seSparseVM    = "ferry-sesparse-vm"
	multiExtentVM = "ferry-multiextent-vm"

	vsanDatastore = "vsanDatastore" // the name vSAN gives its datastore, and vcsim too
	vvolDatastore = "vvolDatastore"
	localDS       = "LocalDS_0"
	keyProvider   = "ferry-kms"

	fixtureDiskKB = 4 << 10 // 4 MiB disks: enough to be real, small enough for CI
	extentKB      = 2 << 10 // twoGbMaxExtentFlat extents of 2 MiB (real ones go up to 2 GB)
	extentCount   = 3
)

// fixtures holds what building them needs: an in-process client and the simulator's registry.
type fixtures struct {
	ctx    context.Context
	m      *simulator.Model
	c      *vim25.Client
	finder *find.Finder
	dc     *object.Datacenter
	vmDir  *object.Folder
}

// addFixtures adds the VMs and datastores of -fixtures to DC0.
func addFixtures(m *simulator.Model) error {
	ctx := context.Background()
	c, err := vim25.NewClient(ctx, m.Service)
	if err != nil {
		return err
	}
	f := &fixtures{ctx: ctx, m: m, c: c, finder: find.NewFinder(c)}
	if f.dc, err = f.finder.DefaultDatacenter(ctx); err != nil {
		return err
	}
	f.finder.SetDatacenter(f.dc)
	folders, err := f.dc.Folders(ctx)
	if err != nil {
		return err
	}
	f.vmDir = folders.VmFolder
	for _, step := range []struct {
		name  string
		build func() error
	}{
		{vsanVM, f.vsan},
		{vvolVM, f.vvol},
		{encryptedVM, f.encrypted},
		{seSparseVM, f.seSparse},
		{multiExtentVM, f.multiExtent},
	} {
		if err := step.build(); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
	}
	return nil
}

// vsan turns vSAN on in the cluster (vcsim then makes vsanDatastore, summary.type "vsan", with vSAN's UUID
// named namespace directories) and puts a VM there whose disk is a vSAN object: the descriptor's extent is
// vsan://<uuid>, and there is no -flat.vmdk to download (OpenNebula/one#7788, libguestfs/virt-v2v#29).
func (f *fixtures) vsan() error {
	cluster, err := f.finder.ClusterComputeResource(f.ctx, "DC0_C0")
	if err != nil {
		return err
	}
	spec := &types.ClusterConfigSpecEx{VsanConfig: &types.VsanClusterConfigInfo{Enabled: types.NewBool(true)}}
	if err := wait(cluster.Reconfigure(f.ctx, spec, true)); err != nil {
		return err
	}
	objectID := uuid.NewString()
	return f.objectDiskVM(cluster, vsanVM, vsanDatastore, objectID, fmt.Sprintf("vsan://%s", objectID))
}

// vvol makes a datastore of summary.type "VVOL" mounted on the cluster's hosts, and a VM there whose disk is a
// vVol object (vvol://<container>/<vvol id> extent, no flat file). vcsim treats VVOL datastores as it treats
// vSAN (UUID-named namespace directories). The extent's exact form is not verified on a real array.
func (f *fixtures) vvol() error {
	cluster, err := f.finder.ClusterComputeResource(f.ctx, "DC0_C0")
	if err != nil {
		return err
	}
	hosts, err := cluster.Hosts(f.ctx)
	if err != nil {
		return err
	}
	home, err := f.option("vcsim.home")
	if err != nil {
		return err
	}
	dir := filepath.Join(home, "DC0-"+vvolDatastore)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, host := range hosts {
		dss, err := host.ConfigManager().DatastoreSystem(f.ctx)
		if err != nil {
			return err
		}
		if _, err := dss.CreateLocalDatastore(f.ctx, vvolDatastore, dir); err != nil {
			return err
		}
	}
	container := fmt.Sprintf("%016x-%016x", uuidHalf(), uuidHalf())
	ds := f.datastore(vvolDatastore)
	f.m.Service.Context.WithLock(ds, func() {
		ds.Summary.Type = string(types.HostFileSystemVolumeFileSystemTypeVVOL)
		info := *ds.Info.GetDatastoreInfo()
		ds.Info = &types.VvolDatastoreInfo{DatastoreInfo: info, VvolDS: &types.HostVvolVolume{
			HostFileSystemVolume: types.HostFileSystemVolume{
				Type: string(types.HostFileSystemVolumeFileSystemTypeVVOL), Name: vvolDatastore,
				Capacity: ds.Summary.Capacity,
			},
			ScId: "vvol:" + container,
		}}
	})
	objectID := "rfc4122." + uuid.NewString()
	return f.objectDiskVM(cluster, vvolVM, vvolDatastore, objectID, fmt.Sprintf("vvol://%s/%s", container, objectID))
}

// objectDiskVM creates a powered-on VM in the cluster on an object datastore (vSAN, vVol) and makes its disk
// an object: the descriptor's only extent is `extent`, the backing's backingObjectId is objectID, and no flat
// file exists. Paths show the home namespace's UUID, not the VM's name, as on vSAN.
func (f *fixtures) objectDiskVM(cluster *object.ClusterComputeResource, name, dsName, objectID, extent string) error {
	pool, err := cluster.ResourcePool(f.ctx)
	if err != nil {
		return err
	}
	vm, err := f.createVM(name, "["+dsName+"]", pool, nil, nil, flatDisk(dsName, name, nil))
	if err != nil {
		return err
	}
	if err := wait(vm.PowerOn(f.ctx)); err != nil {
		return err
	}
	ds := f.datastore(dsName)
	namespace, err := vsanNamespace(ds.Summary.Url, name+".vmx")
	if err != nil {
		return err
	}
	f.renameHome(vm, dsName, name, namespace)
	f.setBackingObjectID(vm, objectID)
	desc := vmdkDescriptor{createType: "vmfs", extents: []string{
		fmt.Sprintf(`RW %d VMFS "%s"`, fixtureDiskKB*2, extent),
	}, ddb: [][2]string{{"ddb.deletable", "true"}, {"ddb.thinProvisioned", "1"}}}
	return replaceDisk(filepath.Join(ds.Summary.Url, namespace), name, desc, nil)
}

// encrypted creates a VM with vSphere VM Encryption through the API: config.keyId and the disk backing's keyId
// are set, and vcsim writes the key locator into the descriptor header (encryptionKeys="vmware:key/..."), as
// ESXi does. The flat file holds
// what would be ciphertext.
func (f *fixtures) encrypted() error {
	host, pool, err := f.standaloneHost()
	if err != nil {
		return err
	}
	key := types.CryptoKeyId{KeyId: uuid.NewString(), ProviderId: &types.KeyProviderId{Id: keyProvider}}
	disk := flatDisk(localDS, encryptedVM, &types.CryptoSpecEncrypt{CryptoKeyId: key})
	vm, err := f.createVM(encryptedVM, "["+localDS+"]", pool, host, &types.CryptoSpecEncrypt{CryptoKeyId: key}, disk)
	if err != nil {
		return err
	}
	// vcsim records config.keyId at creation only for a key it generates; an explicit key goes to the disks alone.
	sim := f.m.Service.Context.Map.Get(vm.Reference()).(*simulator.VirtualMachine)
	f.m.Service.Context.WithLock(sim, func() { sim.Config.KeyId = &key })
	if err := wait(vm.PowerOn(f.ctx)); err != nil {
		return err
	}
	home := filepath.Join(f.datastore(localDS).Summary.Url, encryptedVM)
	if err := fixVcsimHeader(filepath.Join(home, encryptedVM+".vmdk")); err != nil {
		return err
	}
	return os.Truncate(filepath.Join(home, encryptedVM+"-flat.vmdk"), fixtureDiskKB<<10)
}

// seSparse gives a VM a snapshot child on VMFS6's seSparse format: the backing is a
// VirtualDiskSeSparseBackingInfo whose parent is the base disk, the child's descriptor says
// createType="seSparse" with parentFileNameHint, and its extent is an SESPARSE -sesparse.vmdk file.
func (f *fixtures) seSparse() error {
	host, pool, err := f.standaloneHost()
	if err != nil {
		return err
	}
	// The base disk comes first, in the VM's directory, as the snapshot's parent.
	dir := fmt.Sprintf("[%s] %s", localDS, seSparseVM)
	if err := object.NewFileManager(f.c).MakeDirectory(f.ctx, dir, f.dc, true); err != nil {
		return err
	}
	base := fmt.Sprintf("%s/%s.vmdk", dir, seSparseVM)
	child := fmt.Sprintf("%s/%s-000001.vmdk", dir, seSparseVM)
	spec := &types.FileBackedVirtualDiskSpec{
		VirtualDiskSpec: types.VirtualDiskSpec{DiskType: string(types.VirtualDiskTypeThin), AdapterType: "lsiLogic"},
		CapacityKb:      fixtureDiskKB,
	}
	if err := wait(object.NewVirtualDiskManager(f.c).CreateVirtualDisk(f.ctx, base, f.dc, spec)); err != nil {
		return err
	}
	backing := &types.VirtualDiskSeSparseBackingInfo{
		VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: child},
		DiskMode:                     string(types.VirtualDiskModePersistent),
		GrainSize:                    4, // KB: seSparse's default grain
		Parent: &types.VirtualDiskSeSparseBackingInfo{
			VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: base},
			DiskMode:                     string(types.VirtualDiskModePersistent),
			GrainSize:                    4,
		},
	}
	vmx := fmt.Sprintf("%s/%s.vmx", dir, seSparseVM)
	vm, err := f.createVM(seSparseVM, vmx, pool, host, nil, newDisk{backing: backing, capacityKB: fixtureDiskKB})
	if err != nil {
		return err
	}
	if err := wait(vm.PowerOn(f.ctx)); err != nil {
		return err
	}
	home := filepath.Join(f.datastore(localDS).Summary.Url, seSparseVM)
	if err := os.Truncate(filepath.Join(home, seSparseVM+"-flat.vmdk"), fixtureDiskKB<<10); err != nil {
		return err
	}
	if err := fixVcsimHeader(filepath.Join(home, seSparseVM+".vmdk")); err != nil {
		return err
	}
	baseCID, err := descriptorCID(filepath.Join(home, seSparseVM+".vmdk"))
	if err != nil {
		return err
	}
	name := seSparseVM + "-000001"
	desc := vmdkDescriptor{
		createType: "seSparse", parentCID: baseCID, parentHint: seSparseVM + ".vmdk",
		extents: []string{fmt.Sprintf(`RW %d SESPARSE "%s-sesparse.vmdk"`, fixtureDiskKB*2, name)},
		ddb:     [][2]string{{"ddb.grain", "8"}},
	}
	return replaceDisk(home, name, desc, map[string]int64{name + "-sesparse.vmdk": seSparseFileSize})
}

// multiExtent gives a VM a split flat disk (createType twoGbMaxExtentFlat, one FLAT extent line per file, all
// files present), which vSphere reports as a flat backing with split=true.
func (f *fixtures) multiExtent() error {
	host, pool, err := f.standaloneHost()
	if err != nil {
		return err
	}
	disk := flatDisk(localDS, multiExtentVM, nil)
	disk.backing.(*types.VirtualDiskFlatVer2BackingInfo).Split = types.NewBool(true)
	disk.capacityKB = extentKB * extentCount
	if err := f.createPoweredOn(multiExtentVM, localDS, pool, host, nil, disk); err != nil {
		return err
	}
	desc := vmdkDescriptor{createType: "twoGbMaxExtentFlat"}
	files := map[string]int64{}
	for i := 1; i <= extentCount; i++ {
		name := fmt.Sprintf("%s-f%03d.vmdk", multiExtentVM, i)
		desc.extents = append(desc.extents, fmt.Sprintf(`RW %d FLAT "%s" 0`, extentKB*2, name))
		files[name] = extentKB << 10
	}
	home := filepath.Join(f.datastore(localDS).Summary.Url, multiExtentVM)
	return replaceDisk(home, multiExtentVM, desc, files)
}
