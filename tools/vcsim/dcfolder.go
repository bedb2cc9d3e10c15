package main

import (
	"context"
	"strings"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// moveDatacenters creates the root-level folder `name` and moves every datacenter into it, as vCenters that group
// datacenters by site or tenant do: DC0's inventory path becomes name/DC0.
func moveDatacenters(m *simulator.Model, name string) error {
	ctx := context.Background()
	c, err := vim25.NewClient(ctx, m.Service)
	if err != nil {
		return err
	}
	dcs, err := find.NewFinder(c).DatacenterList(ctx, "*")
	if err != nil {
		return err
	}
	folder, err := object.NewRootFolder(c).CreateFolder(ctx, name)
	if err != nil {
		return err
	}
	refs := make([]types.ManagedObjectReference, len(dcs))
	for i, dc := range dcs {
		refs[i] = dc.Reference()
	}
	task, err := folder.MoveInto(ctx, refs)
	if err != nil {
		return err
	}
	return task.Wait(ctx)
}

// datacenterPaths lists the inventory path of each datacenter, without the leading '/': what /folder takes as
// dcPath on a real vCenter.
func datacenterPaths(m *simulator.Model) ([]string, error) {
	reg := m.Service.Context.Map
	var paths []string
	for _, e := range reg.All("Datacenter") {
		names := []string{}
		for obj := mo.Entity(e); obj != nil; {
			me := obj.Entity()
			if me.Parent == nil {
				break // the root folder has no name in paths
			}
			names = append([]string{me.Name}, names...)
			parent, _ := reg.Get(*me.Parent).(mo.Entity)
			obj = parent
		}
		paths = append(paths, strings.Join(names, "/"))
	}
	return paths, nil
}
