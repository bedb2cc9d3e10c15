package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
	"github.com/vmware/govmomi/vim25/xml"
)

// QueryChangedDiskAreas, which vcsim does not implement. vcsim still decides who may call: the call goes to it
// first, and only its "does not implement" (an authenticated caller) is replaced by the model's answer.

func (c *cbtModel) queryHandler(next http.Handler, body []byte, ctx *simulator.Context) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		if rec.Code != http.StatusInternalServerError || !bytes.Contains(rec.Body.Bytes(), []byte("MethodNotFound")) {
			for k, v := range rec.Header() {
				rw.Header()[k] = v
			}
			rw.WriteHeader(rec.Code)
			_, _ = rw.Write(rec.Body.Bytes())
			return
		}
		var answer any
		method, err := simulator.UnmarshalBody(types.TypeFunc(), body)
		req, ok := (*types.QueryChangedDiskAreas)(nil), false
		if err == nil {
			req, ok = method.Body.(*types.QueryChangedDiskAreas)
		}
		vm, isVM := ctx.Map.Get(method.This).(*simulator.VirtualMachine)
		switch {
		case !ok:
			answer = soapFault{Code: "ServerFaultCode", String: fmt.Sprintf("cannot read the request: %v", err)}
		case !isVM:
			answer = faultAnswer(fmt.Sprintf("managed object not found: %s", method.This), &types.ManagedObjectNotFound{Obj: method.This})
		default:
			info, msg, fault := c.query(ctx, vm, req)
			if fault != nil {
				answer = faultAnswer(msg, fault)
			} else {
				answer = queryResponse{Returnval: info}
			}
		}
		var out bytes.Buffer
		out.WriteString(xml.Header)
		enc := xml.NewEncoder(&out)
		err = enc.Encode(&soapEnvelope{
			Env:  "http://schemas.xmlsoap.org/soap/envelope/",
			XSD:  "http://www.w3.org/2001/XMLSchema",
			XSI:  "http://www.w3.org/2001/XMLSchema-instance",
			Body: soapBody{answer},
		})
		if err == nil {
			err = enc.Flush()
		}
		if err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		rw.Header().Set("Content-Type", "text/xml; charset=utf-8")
		if _, isFault := answer.(soapFault); isFault {
			rw.WriteHeader(http.StatusInternalServerError)
		}
		_, _ = rw.Write(out.Bytes())
	})
}

// The answer's XML, laid out as vcsim lays out its own (simulator.go).
type soapEnvelope struct {
	XMLName xml.Name `xml:"soapenv:Envelope"`
	Env     string   `xml:"xmlns:soapenv,attr"`
	XSD     string   `xml:"xmlns:xsd,attr"`
	XSI     string   `xml:"xmlns:xsi,attr"`
	Body    any      `xml:"soapenv:Body"`
}

// soapBody holds the answer, whose XMLName names its element.
type soapBody struct{ Answer any }

type queryResponse struct {
	XMLName   xml.Name             `xml:"urn:vim25 QueryChangedDiskAreasResponse"`
	Returnval types.DiskChangeInfo `xml:"returnval"`
}

type soapFault struct {
	XMLName xml.Name `xml:"soapenv:Fault"`
	Code    string   `xml:"faultcode"`
	String  string   `xml:"faultstring"`
	Detail  *struct {
		Fault faultDetail
	} `xml:"detail,omitempty"`
}

func faultAnswer(msg string, fault types.BaseMethodFault) soapFault {
	f := soapFault{Code: "ServerFaultCode", String: msg}
	f.Detail = &struct{ Fault faultDetail }{faultDetail{fault}}
	return f
}

// faultDetail is <NameFault xsi:type="Name">, as vSphere writes a fault's detail.
type faultDetail struct{ fault types.BaseMethodFault }

func (d faultDetail) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	kind := reflect.TypeOf(d.fault).Elem().Name()
	start.Name = xml.Name{Local: kind + "Fault"}
	start.Attr = append(start.Attr,
		xml.Attr{Name: xml.Name{Local: "xmlns"}, Value: "urn:vim25"},
		xml.Attr{Name: xml.Name{Local: "xsi:type"}, Value: kind})
	return e.EncodeElement(d.fault, start)
}

// query answers as vSphere documents it: the areas of disk deviceKey written since changeId, up to the snapshot
// (or up to now, only while the VM is off), one page from startOffset.
func (c *cbtModel) query(ctx *simulator.Context, vm *simulator.VirtualMachine, req *types.QueryChangedDiskAreas) (types.DiskChangeInfo, string, types.BaseMethodFault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	invalid := func(prop, msg string) (types.DiskChangeInfo, string, types.BaseMethodFault) {
		return types.DiskChangeInfo{}, msg, &types.InvalidArgument{InvalidProperty: prop}
	}
	var d *cbtDisk
	for _, disk := range vmDisks(vm) {
		if disk.Key == req.DeviceKey {
			d, _ = c.disk(ctx, vm, disk.Key)
		}
	}
	if d == nil {
		return invalid("deviceKey", fmt.Sprintf("no virtual disk with key %d", req.DeviceKey))
	}
	if req.StartOffset < 0 || req.StartOffset >= d.capacity {
		return invalid("startOffset", fmt.Sprintf("startOffset %d is not within the disk (%d bytes)", req.StartOffset, d.capacity))
	}
	if d.state != trackingActive {
		return invalid("changeId", "change tracking is not active on the disk")
	}
	var end changePoint
	if req.Snapshot != nil {
		s, ok := c.snapshots[*req.Snapshot]
		if !ok || s.vm != vm.Self {
			return types.DiskChangeInfo{}, fmt.Sprintf("snapshot %s not found", req.Snapshot.Value), &types.NotFound{}
		}
		if end, ok = s.points[req.DeviceKey]; !ok {
			return invalid("changeId", fmt.Sprintf("the snapshot has no change ID for disk %d", req.DeviceKey))
		}
	} else {
		if vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn {
			msg := "the disk is in use: without a snapshot, changed areas can be queried only while the VM is powered off"
			return types.DiskChangeInfo{}, msg, &types.FileFault{File: d.base}
		}
		end = changePoint{epoch: d.now.epoch, stun: d.now.stun + 1}
	}
	var blocks blockSet
	if req.ChangeId == "*" {
		var err error
		if blocks, err = d.allocated(); err != nil {
			return types.DiskChangeInfo{}, err.Error(), &types.FileFault{File: d.base}
		}
		if req.Snapshot == nil && d.layer != nil {
			blocks.union(d.layerBlocks)
		}
	} else {
		from, ok := parseChangeID(req.ChangeId)
		if ok && end.epoch == d.now.epoch {
			blocks = d.changedSince(from, end.stun)
		}
		if blocks == nil {
			return invalid("changeId", fmt.Sprintf("change ID %q is not valid for this disk (now %s)", req.ChangeId, d.now))
		}
	}
	p := changedPage(blocks, d.capacity, req.StartOffset, c.maxAreas, c.window)
	info := types.DiskChangeInfo{StartOffset: p.start, Length: p.length}
	for _, a := range p.areas {
		info.ChangedArea = append(info.ChangedArea, types.DiskChangeExtent{Start: a.start, Length: a.length})
	}
	return info, "", nil
}
