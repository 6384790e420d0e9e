//! The runtime's kernel cache: statistics, listing and clearing.
use std::ffi::{c_int, c_void, CStr};

use flashattn_sys as sys;

use crate::error::{check, Result};
use crate::runtime::{c_chars, Runtime};

/// Counters and location of a runtime's kernel cache (fa_cache_stats).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Launches served by the in-process kernel map.
    pub memory_hits: u64,
    /// Kernels loaded from the on-disk store.
    pub disk_hits: u64,
    /// Kernels generated.
    pub misses: u64,
    /// PTX -> binary compilations (cuda).
    pub compiles: u64,
    /// Stored blobs whose hash did not verify.
    pub discarded: u64,
    /// Rows in the store.
    pub entries: u64,
    /// PTX + cubin bytes in the store.
    pub bytes: u64,
    /// On disk (true) or memory only.
    pub persistent: bool,
    /// Database file, "" when memory only.
    pub path: String,
    /// Why memory only, or the last warning; "" if none.
    pub note: String,
    /// Rows with this key but another kernel's key material.
    pub collisions: u64,
    /// Rows deleted to stay under max_bytes.
    pub evicted: u64,
    /// Damaged database files emptied in place.
    pub resets: u64,
    /// Compile leases taken.
    pub leases: u64,
    /// Leases taken over from a dead or expired holder.
    pub leases_reclaimed: u64,
    /// Kernels another process built while this one waited.
    pub lease_waits: u64,
    /// Waits that ran out (the kernel was built here).
    pub lease_timeouts: u64,
    /// Size cap in force (FLASHATTN_CACHE_MAX_BYTES); 0 = none.
    pub max_bytes: u64,
    /// Since 0.6: how this runtime turns PTX into machine code.
    pub compiler_mode: CompilerMode,
    /// The PTX compiler plugin's version, "driver-jit", or "" (emulator).
    pub compiler: String,
    /// Why the PTX compiler plugin is not used; "" when it is.
    pub compiler_note: String,
    /// Cubins the driver refused (their PTX was JIT-compiled, the row rewritten).
    pub cubin_refusals: u64,
}

/// fa_compiler_mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompilerMode {
    /// The emulator runs the PTX itself.
    #[default]
    None,
    /// The driver JIT-compiles the stored PTX when a kernel is loaded.
    DriverJit,
    /// The PTX compiler plugin builds a cubin on a miss; hits load it.
    Plugin,
    /// A value this binding does not know (a newer library).
    Other(i32),
}

impl CompilerMode {
    fn from_raw(v: sys::fa_compiler_mode) -> Self {
        match v {
            sys::FA_COMPILER_NONE => CompilerMode::None,
            sys::FA_COMPILER_DRIVER_JIT => CompilerMode::DriverJit,
            sys::FA_COMPILER_PLUGIN => CompilerMode::Plugin,
            other => CompilerMode::Other(other),
        }
    }
}

/// One stored kernel (fa_cache_entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// 32 hex digits of the XXH3-128 key.
    pub key: String,
    /// Human-readable kernel spec.
    pub spec: String,
    pub sm: i32,
    pub generator_version: u32,
    pub ptx_bytes: u64,
    pub cubin_bytes: u64,
    pub hits: u64,
    /// Unix seconds.
    pub created: i64,
    pub last_used: i64,
    /// Since 0.6: what built the binary (plugin version, "driver-jit", ...); "" for older rows.
    pub compiler: String,
}

/// fa_cache_list callback: copies the entry into the Vec behind `user`.
unsafe extern "C" fn collect(entry: *const sys::fa_cache_entry, user: *mut c_void) -> c_int {
    // SAFETY: user is the &mut Vec passed by cache_list; entry is valid during the call.
    let out = &mut *(user as *mut Vec<CacheEntry>);
    let e = &*entry;
    let owned = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    out.push(CacheEntry {
        key: c_chars(&e.key),
        spec: owned(e.spec),
        sm: e.sm,
        generator_version: e.generator_version,
        ptx_bytes: e.ptx_bytes,
        cubin_bytes: e.cubin_bytes,
        hits: e.hits,
        created: e.created,
        last_used: e.last_used,
        compiler: owned(e.compiler),
    });
    0
}

impl Runtime {
    /// Cache counters and location.
    pub fn cache_stats(&self) -> Result<CacheStats> {
        let mut s = sys::fa_cache_stats::default();
        // SAFETY: valid handle and correctly sized out struct.
        check(unsafe { sys::fa_cache_stats_get(self.as_raw(), &mut s) })?;
        Ok(CacheStats {
            memory_hits: s.memory_hits,
            disk_hits: s.disk_hits,
            misses: s.misses,
            compiles: s.compiles,
            discarded: s.discarded,
            entries: s.entries,
            bytes: s.bytes,
            persistent: s.persistent != 0,
            path: c_chars(&s.path),
            note: c_chars(&s.note),
            collisions: s.collisions,
            evicted: s.evicted,
            resets: s.resets,
            leases: s.leases,
            leases_reclaimed: s.leases_reclaimed,
            lease_waits: s.lease_waits,
            lease_timeouts: s.lease_timeouts,
            max_bytes: s.max_bytes,
            compiler_mode: CompilerMode::from_raw(s.compiler_mode),
            compiler: c_chars(&s.compiler),
            compiler_note: c_chars(&s.compiler_note),
            cubin_refusals: s.cubin_refusals,
        })
    }

    /// Every stored kernel.
    pub fn cache_list(&self) -> Result<Vec<CacheEntry>> {
        let mut out: Vec<CacheEntry> = Vec::new();
        // SAFETY: the callback only touches `out`, which outlives the call.
        check(unsafe {
            sys::fa_cache_list(
                self.as_raw(),
                Some(collect),
                (&mut out as *mut Vec<CacheEntry>).cast(),
            )
        })?;
        Ok(out)
    }

    /// Deletes every stored kernel (loaded kernels stay usable).
    pub fn cache_clear(&self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::fa_cache_clear(self.as_raw()) })
    }
}
