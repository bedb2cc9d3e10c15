package main

import "math/bits"

// Changed Block Tracking's bookkeeping, free of the simulator: block sets and the pages of
// QueryChangedDiskAreas answers.

// cbtBlock is CBT's granularity: a 4 MiB write comes back as one extent of 4,259,840 bytes, scattered sectors
// as 64 KiB extents (cloudbase/OpenVixDiskLib docs/cbt.md).
const cbtBlock = 64 << 10

// blockSet is a set of 64 KiB blocks of one disk.
type blockSet []uint64

func newBlockSet(capacity int64) blockSet {
	blocks := (capacity + cbtBlock - 1) / cbtBlock
	return make(blockSet, (blocks+63)/64)
}

func (s blockSet) has(b int64) bool { return s[b/64]&(1<<(b%64)) != 0 }
func (s blockSet) add(b int64)      { s[b/64] |= 1 << (b % 64) }

// addRange marks every block that [offset, offset+length) touches.
func (s blockSet) addRange(offset, length int64) {
	for b := offset / cbtBlock; b*cbtBlock < offset+length; b++ {
		s.add(b)
	}
}

func (s blockSet) union(o blockSet) {
	for i := range s {
		s[i] |= o[i]
	}
}

func (s blockSet) count() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// area is one changed extent: byte offset and length.
type area struct{ start, length int64 }

// page is one QueryChangedDiskAreas answer: the window [start, start+length) and its areas.
type page struct {
	start, length int64
	areas         []area
}

// changedPage answers one query from start: the marked blocks coalesced into areas, in order, ending at the
// disk's end, at the window's end (windowBytes > 0: a page covers at most that much of the disk, so a window
// with no change is an empty page short of the end) or after maxAreas areas (the page then ends at its last
// area, so the next query starts after it).
func changedPage(s blockSet, capacity, start int64, maxAreas int, windowBytes int64) page {
	end := capacity
	if windowBytes > 0 {
		end = min(capacity, start+windowBytes)
	}
	p := page{start: start}
	b := start / cbtBlock
	for b*cbtBlock < end {
		if !s.has(b) {
			b++
			continue
		}
		first := b
		for b*cbtBlock < end && s.has(b) {
			b++
		}
		a := area{start: max(first*cbtBlock, start), length: 0}
		a.length = min(b*cbtBlock, end) - a.start
		p.areas = append(p.areas, a)
		if maxAreas > 0 && len(p.areas) == maxAreas {
			p.length = a.start + a.length - start
			return p
		}
	}
	p.length = end - start
	return p
}
