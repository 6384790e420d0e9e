package flashattn

/*
#include "shim.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// CacheStats are a runtime's kernel-cache counters (fa_cache_stats).
type CacheStats struct {
	MemoryHits, DiskHits, Misses, Compiles, Discarded uint64
	Entries, Bytes                                    uint64
	Persistent                                        bool         // on disk
	Path                                              string       // "" when memory only
	Note                                              string       // why memory only, or the last warning
	Collisions                                        uint64       // rows with this key but another kernel's key material
	Evicted                                           uint64       // rows deleted to stay under MaxBytes
	Resets                                            uint64       // damaged database files emptied in place
	Leases                                            uint64       // compile leases taken...
	LeasesReclaimed                                   uint64       // ...of which from a dead or expired holder
	LeaseWaits                                        uint64       // kernels another process built while this one waited
	LeaseTimeouts                                     uint64       // waits that ran out (the kernel was built here)
	MaxBytes                                          uint64       // size cap in force (FLASHATTN_CACHE_MAX_BYTES); 0 = none
	CompilerMode                                      CompilerMode // since 0.6: how PTX becomes machine code
	Compiler                                          string       // the PTX compiler plugin's version, "driver-jit", or ""
	CompilerNote                                      string       // why the plugin is not used; "" when it is
	CubinRefusals                                     uint64       // cubins the driver refused (their PTX was JIT-compiled)
}

// CompilerMode is fa_compiler_mode.
type CompilerMode int32

const (
	CompilerNone      CompilerMode = C.FA_COMPILER_NONE       // the emulator runs the PTX
	CompilerDriverJIT CompilerMode = C.FA_COMPILER_DRIVER_JIT // the driver JIT-compiles the PTX on load
	CompilerPlugin    CompilerMode = C.FA_COMPILER_PLUGIN     // the PTX compiler plugin builds a cubin on a miss
)

// CacheStats returns the cache counters of rt.
func (rt *Runtime) CacheStats() (CacheStats, error) {
	p, err := rt.acquire("CacheStats")
	if err != nil {
		return CacheStats{}, err
	}
	defer rt.mu.RUnlock()
	var s C.fa_cache_stats
	s.struct_size = C.size_t(unsafe.Sizeof(s))
	var e C.fago_err
	if err := check(C.fago_cache_stats(p, &s, &e), &e); err != nil {
		return CacheStats{}, err
	}
	return CacheStats{
		MemoryHits:      uint64(s.memory_hits),
		DiskHits:        uint64(s.disk_hits),
		Misses:          uint64(s.misses),
		Compiles:        uint64(s.compiles),
		Discarded:       uint64(s.discarded),
		Entries:         uint64(s.entries),
		Bytes:           uint64(s.bytes),
		Persistent:      s.persistent != 0,
		Path:            C.GoString(&s.path[0]),
		Note:            C.GoString(&s.note[0]),
		Collisions:      uint64(s.collisions),
		Evicted:         uint64(s.evicted),
		Resets:          uint64(s.resets),
		Leases:          uint64(s.leases),
		LeasesReclaimed: uint64(s.leases_reclaimed),
		LeaseWaits:      uint64(s.lease_waits),
		LeaseTimeouts:   uint64(s.lease_timeouts),
		MaxBytes:        uint64(s.max_bytes),
		CompilerMode:    CompilerMode(s.compiler_mode),
		Compiler:        C.GoString(&s.compiler[0]),
		CompilerNote:    C.GoString(&s.compiler_note[0]),
		CubinRefusals:   uint64(s.cubin_refusals),
	}, nil
}

// CacheEntry is one stored kernel.
type CacheEntry struct {
	Key              string // 32 hex digits (XXH3-128)
	Spec             string // human-readable kernel spec
	SM               int
	GeneratorVersion uint32
	PTXBytes         uint64
	CubinBytes       uint64
	Hits             uint64
	Created          time.Time
	LastUsed         time.Time
	Compiler         string // since 0.6: what built the binary; "" for older rows
}

// CacheList returns every stored kernel.
func (rt *Runtime) CacheList() ([]CacheEntry, error) {
	p, err := rt.acquire("CacheList")
	if err != nil {
		return nil, err
	}
	defer rt.mu.RUnlock()
	var l C.fago_list
	var e C.fago_err
	if err := check(C.fago_cache_list(p, &l, &e), &e); err != nil {
		return nil, err
	}
	defer C.fago_list_free(&l)
	out := make([]CacheEntry, 0, int(l.len))
	if l.len == 0 {
		return out, nil
	}
	items := unsafe.Slice(l.items, int(l.len))
	for i := range items {
		it := &items[i]
		out = append(out, CacheEntry{
			Key:              C.GoString(&it.key[0]),
			Spec:             C.GoString(it.spec),
			SM:               int(it.sm),
			GeneratorVersion: uint32(it.generator_version),
			PTXBytes:         uint64(it.ptx_bytes),
			CubinBytes:       uint64(it.cubin_bytes),
			Hits:             uint64(it.hits),
			Created:          time.Unix(int64(it.created), 0),
			LastUsed:         time.Unix(int64(it.last_used), 0),
			Compiler:         C.GoString(it.compiler),
		})
	}
	return out, nil
}

// CacheClear deletes every stored kernel (loaded kernels stay usable).
func (rt *Runtime) CacheClear() error {
	p, err := rt.acquire("CacheClear")
	if err != nil {
		return err
	}
	defer rt.mu.RUnlock()
	var e C.fago_err
	return check(C.fago_cache_clear(p, &e), &e)
}
