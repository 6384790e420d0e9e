//! Compares every struct size, field offset and constant of the Rust
//! declarations with the C header, by compiling and running a small C program
//! against the installed flashattn.h ($CC or `cc`, include dir from build.rs).
use flashattn_sys::*;
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

/// Rows "name value" for a struct: its size and each field's offset.
macro_rules! layout {
    ($rows:ident, $t:ident { $($f:ident),* $(,)? }) => {
        $rows.push((stringify!($t).to_string(), format!("sizeof({})", stringify!($t)),
                    size_of::<$t>() as i64));
        $( $rows.push((format!("{}.{}", stringify!($t), stringify!($f)),
                       format!("offsetof({}, {})", stringify!($t), stringify!($f)),
                       offset_of!($t, $f) as i64)); )*
    };
}

/// Rows for integer constants (the C side prints them as long long).
macro_rules! consts {
    ($rows:ident, $($c:ident),* $(,)?) => {
        $( $rows.push((stringify!($c).to_string(), format!("(long long){}", stringify!($c)),
                       $c as i64)); )*
    };
}

fn rust_rows() -> Vec<(String, String, i64)> {
    let mut rows = Vec::new();
    layout!(
        rows,
        fa_runtime_options {
            struct_size,
            backend,
            device,
            cache_mode,
            cache_dir,
            emulator_sm,
            ptx_compiler,
            kernel_store
        }
    );
    layout!(
        rows,
        fa_runtime_info { struct_size, backend, sm, num_sms, driver_version, device_name }
    );
    layout!(
        rows,
        fa_config_desc {
            struct_size,
            dtype,
            head_dim,
            head_dim_v,
            num_heads_q,
            num_heads_kv,
            causal,
            window_left,
            window_right,
            softmax_scale,
            softcap,
            kv_dtype,
            q_dtype
        }
    );
    layout!(rows, fa_tensor { data, stride });
    layout!(
        rows,
        fa_generate_options {
            struct_size,
            kv_layout,
            page_size,
            varlen,
            seqused_k,
            tree_mask,
            lse_partial_format,
            lse_format,
            sinks,
            alibi,
            append_kv,
            rotary,
            rotary_dtype,
            v_in_k
        }
    );
    layout!(
        rows,
        fa_emu_mem_counters {
            global_load_requests,
            global_load_sectors,
            global_load_bytes,
            cp_async_requests,
            cp_async_sectors,
            cp_async_bytes,
            global_store_requests,
            global_store_sectors,
            global_store_bytes,
            shared_requests,
            shared_wavefronts,
            shared_bank_conflicts
        }
    );
    layout!(
        rows,
        fa_emu_profile {
            struct_size,
            kernel,
            total,
            main_loop,
            main_loop_first_line,
            main_loop_last_line,
            main_loop_worst_conflict_line,
            main_loop_worst_sector_line
        }
    );
    layout!(
        rows,
        fa_kv_cache_layout {
            layout,
            page_size,
            num_pages,
            max_pages_per_seq,
            block_table,
            block_table_stride,
            k_ptrs,
            v_ptrs
        }
    );
    layout!(
        rows,
        fa_forward_args {
            struct_size,
            batch,
            seqlen_q,
            seqlen_k,
            q,
            k,
            v,
            o,
            lse,
            cu_seqlens_q,
            cu_seqlens_k,
            kv,
            seqused_k,
            sinks,
            alibi_slopes,
            alibi_slopes_stride,
            k_descale,
            v_descale,
            descale_stride,
            q_descale,
            workspace,
            workspace_size
        }
    );
    layout!(
        rows,
        fa_decode_args {
            struct_size,
            batch,
            seqlen_q,
            seqlen_k_max,
            q,
            k_cache,
            v_cache,
            cache_seqlens,
            num_splits,
            workspace,
            workspace_size,
            o,
            lse,
            kv,
            batch_invariant,
            tree_mask,
            tree_mask_stride,
            sinks,
            alibi_slopes,
            alibi_slopes_stride,
            k_descale,
            v_descale,
            descale_stride,
            k_new,
            v_new,
            seqlen_new,
            rotary_dim,
            rotary_cos,
            rotary_sin,
            seqlen_ro,
            rotary_interleaved,
            rotary_dtype,
            rotary_reserved,
            rotary_positions,
            rotary_positions_stride,
            split_counters,
            split_counters_size
        }
    );
    layout!(
        rows,
        fa_reduce_args {
            struct_size,
            num_splits,
            batch,
            seqlen_q,
            o_partial,
            o_partial_stride,
            lse_partial,
            lse_partial_stride,
            o,
            lse,
            lse_partial_format,
            lse_format,
            sinks
        }
    );
    layout!(
        rows,
        fa_cache_stats {
            struct_size,
            memory_hits,
            disk_hits,
            misses,
            compiles,
            discarded,
            entries,
            bytes,
            persistent,
            path,
            note,
            collisions,
            evicted,
            resets,
            leases,
            leases_reclaimed,
            lease_waits,
            lease_timeouts,
            max_bytes,
            compiler_mode,
            compiler,
            compiler_note,
            cubin_refusals,
            remote_hits,
            remote_misses,
            remote_puts,
            remote_errors,
            remote_discarded,
            kernel_store,
            kernel_store_note
        }
    );
    layout!(
        rows,
        fa_cache_entry {
            struct_size,
            key,
            spec,
            sm,
            generator_version,
            ptx_bytes,
            cubin_bytes,
            hits,
            created,
            last_used,
            compiler
        }
    );
    layout!(
        rows,
        fa_cache_warm_progress {
            struct_size,
            total,
            done,
            built,
            present,
            failed,
            skipped,
            bytes,
            seconds,
            spec,
            sm,
            compiler
        }
    );
    layout!(
        rows,
        fa_cache_warm_options {
            struct_size,
            cache_dir,
            sms,
            num_sms,
            jobs,
            presets,
            specs,
            ptx_compiler,
            progress,
            user
        }
    );
    rows.push(("fa_status".into(), "sizeof(fa_status)".into(), size_of::<fa_status>() as i64));
    layout!(
        rows,
        fa_backward_args {
            struct_size,
            fwd,
            dout,
            dq,
            dk,
            dv,
            dsinks,
            workspace,
            workspace_size,
            deterministic
        }
    );
    rows.push(("fa_dtype".into(), "sizeof(fa_dtype)".into(), size_of::<fa_dtype>() as i64));
    rows.push(("fa_backend".into(), "sizeof(fa_backend)".into(), size_of::<fa_backend>() as i64));
    rows.push((
        "fa_kernel_kind".into(),
        "sizeof(fa_kernel_kind)".into(),
        size_of::<fa_kernel_kind>() as i64,
    ));
    rows.push((
        "fa_cache_mode".into(),
        "sizeof(fa_cache_mode)".into(),
        size_of::<fa_cache_mode>() as i64,
    ));
    rows.push((
        "fa_kv_layout".into(),
        "sizeof(fa_kv_layout)".into(),
        size_of::<fa_kv_layout>() as i64,
    ));
    consts!(
        rows,
        FA_SUCCESS,
        FA_ERROR_INVALID_ARGUMENT,
        FA_ERROR_UNSUPPORTED,
        FA_ERROR_OUT_OF_MEMORY,
        FA_ERROR_NO_DRIVER,
        FA_ERROR_NO_DEVICE,
        FA_ERROR_CUDA,
        FA_ERROR_COMPILE,
        FA_ERROR_LAUNCH,
        FA_ERROR_RUNTIME_POISONED,
        FA_ERROR_BUFFER_TOO_SMALL,
        FA_ERROR_INTERNAL,
        FA_ERROR_CACHE,
        FA_STATUS_LAST,
        FA_DTYPE_FP16,
        FA_DTYPE_BF16,
        FA_DTYPE_FP32,
        FA_BACKEND_AUTO,
        FA_BACKEND_CUDA,
        FA_BACKEND_EMULATOR,
        FA_KERNEL_FORWARD,
        FA_KERNEL_DECODE,
        FA_KERNEL_REDUCE,
        FA_KERNEL_BACKWARD_PRE,
        FA_KERNEL_BACKWARD,
        FA_KERNEL_BACKWARD_POST,
        FA_CACHE_DEFAULT,
        FA_CACHE_DISK,
        FA_CACHE_MEMORY,
        FA_KV_CONTIGUOUS,
        FA_KV_PAGED,
        FA_KV_PTR_ARRAY,
        FA_FORWARD_ARGS_SIZE_0_2,
        FA_DECODE_ARGS_SIZE_0_2,
        FA_DECODE_ARGS_SIZE_0_3,
        FA_REDUCE_ARGS_SIZE_0_3,
        FA_GENERATE_OPTIONS_SIZE_0_3,
        FA_FORWARD_ARGS_SIZE_0_4,
        FA_DECODE_ARGS_SIZE_0_4,
        FA_REDUCE_ARGS_SIZE_0_4,
        FA_GENERATE_OPTIONS_SIZE_0_4,
        FA_CONFIG_DESC_SIZE_0_4,
        FA_FORWARD_ARGS_SIZE_0_4_1,
        FA_DECODE_ARGS_SIZE_0_4_1,
        FA_GENERATE_OPTIONS_SIZE_0_4_1,
        FA_GENERATE_OPTIONS_SIZE_0_5,
        FA_CONFIG_DESC_SIZE_0_5,
        FA_FORWARD_ARGS_SIZE_0_5,
        FA_FORWARD_ARGS_SIZE_0_7,
        FA_DECODE_ARGS_SIZE_0_5,
        FA_DTYPE_FP8_E4M3,
        FA_DTYPE_FP8_E5M2,
        FA_LSE_NATURAL,
        FA_LSE_BASE2,
        FA_DECODE_INVARIANT_SPLIT,
        FA_CACHE_STATS_SIZE_0_1,
        FA_CACHE_STATS_SIZE_0_5,
        FA_RUNTIME_OPTIONS_SIZE_0_5,
        FA_RUNTIME_OPTIONS_SIZE_0_6,
        FA_CACHE_STATS_SIZE_0_6,
        FA_PTX_COMPILER_AUTO,
        FA_PTX_COMPILER_OFF,
        FA_COMPILER_NONE,
        FA_COMPILER_DRIVER_JIT,
        FA_COMPILER_PLUGIN,
        FA_MAX_SEQLEN,
        FLASHATTN_VERSION_MAJOR,
        FLASHATTN_VERSION_MINOR,
        FLASHATTN_VERSION_PATCH,
        FLASHATTN_VERSION_NUMBER
    );
    rows
}

/// A fresh scratch directory under the target dir (or the system temp dir).
fn scratch_dir() -> PathBuf {
    let base =
        option_env!("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("flashattn-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn layout_matches_c_header() {
    let rows = rust_rows();
    let include = env!("FLASHATTN_SYS_INCLUDE_DIR");
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <flashattn.h>\nint main(void) {\n",
    );
    for (name, expr, _) in &rows {
        src.push_str(&format!("  printf(\"%s %lld\\n\", \"{name}\", (long long)({expr}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let dir = scratch_dir();
    let c_path = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_path, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .arg("-std=c99")
        .arg(format!("-I{include}"))
        .arg(&c_path)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        out.status.success(),
        "C compile failed (include dir {include}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let c: BTreeMap<String, i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let mut mismatches = Vec::new();
    for (name, _, rust) in &rows {
        if c.get(name) != Some(rust) {
            mismatches.push(format!("{name}: rust {rust}, C {:?}", c.get(name)));
        }
    }
    assert_eq!(c.len(), rows.len(), "every row printed once");
    assert!(mismatches.is_empty(), "layout mismatches:\n{}", mismatches.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn defaults_match_init_macros() {
    // The FA_*_INIT initializers set struct_size = sizeof and windows to -1.
    assert_eq!(fa_runtime_options::default().struct_size, size_of::<fa_runtime_options>());
    assert_eq!(fa_runtime_info::default().struct_size, size_of::<fa_runtime_info>());
    let d = fa_config_desc::default();
    assert_eq!(
        (d.struct_size, d.dtype, d.window_left, d.window_right),
        (size_of::<fa_config_desc>(), FA_DTYPE_FP16, -1, -1)
    );
    assert_eq!(fa_forward_args::default().struct_size, size_of::<fa_forward_args>());
    assert_eq!(fa_decode_args::default().struct_size, size_of::<fa_decode_args>());
    // FA_KV_CACHE_LAYOUT_INIT is all zeros (contiguous); so are the new fields.
    assert_eq!(fa_kv_cache_layout::default().layout, FA_KV_CONTIGUOUS);
    assert_eq!(fa_forward_args::default().kv, fa_kv_cache_layout::default());
    assert_eq!(fa_forward_args::default().seqused_k, 0);
    assert_eq!(fa_decode_args::default().batch_invariant, 0);
    assert_eq!(fa_reduce_args::default().struct_size, size_of::<fa_reduce_args>());
    // 0.4's fields default to "as 0.3": natural logs, no tree mask.
    let r = fa_reduce_args::default();
    assert_eq!((r.lse_partial_format, r.lse_format), (FA_LSE_NATURAL, FA_LSE_NATURAL));
    let d = fa_decode_args::default();
    assert_eq!((d.tree_mask, d.tree_mask_stride), (0, [0, 0]));
    let g = fa_generate_options::default();
    assert_eq!((g.tree_mask, g.lse_partial_format, g.lse_format), (0, 0, 0));
    // 0.4.1's fields default to "as 0.4": no sinks.
    assert_eq!((fa_forward_args::default().sinks, d.sinks, r.sinks, g.sinks), (0, 0, 0, 0));
    // 0.5's fields default to "as 0.4.1": no ALiBi.
    let f = fa_forward_args::default();
    assert_eq!(
        (f.alibi_slopes, f.alibi_slopes_stride, d.alibi_slopes, d.alibi_slopes_stride, g.alibi),
        (0, 0, 0, 0, 0)
    );
    // 0.5.1's field defaults to "as 0.5": V read as its own tensor.
    assert_eq!(g.v_in_k, 0);
    // 0.5's fields default to "as 0.4.1": a 16-bit cache, no descales.
    assert_eq!(fa_config_desc::default().kv_dtype, 0);
    assert_eq!((d.k_descale, d.v_descale, d.descale_stride), (0, 0, [0, 0]));
    // 0.5's fields default to "as 0.4.1": no KV append, no rotary.
    assert_eq!((d.k_new.data, d.v_new.data, d.seqlen_new, d.rotary_dim), (0, 0, 0, 0));
    assert_eq!((d.rotary_cos, d.rotary_sin, d.rotary_positions), (0, 0, 0));
    assert_eq!(
        (d.seqlen_ro, d.rotary_interleaved, d.rotary_dtype, d.rotary_reserved),
        (0, 0, 0, 0)
    );
    assert_eq!(d.rotary_positions_stride, 0);
    // 0.8's: no split counters (the combine a second launch).
    assert_eq!((d.split_counters, d.split_counters_size), (0, 0));
    assert_eq!((g.append_kv, g.rotary, g.rotary_dtype), (0, 0, 0));
    // 0.6's fields default to "as 0.5": a Q of dtype, no Q descale.
    assert_eq!((fa_config_desc::default().q_dtype, f.q_descale), (0, 0));
    assert_eq!(fa_cache_stats::default().struct_size, size_of::<fa_cache_stats>());
    // FA_BACKWARD_ARGS_INIT: both struct_sizes, everything else 0.
    let b = fa_backward_args::default();
    assert_eq!(
        (b.struct_size, b.fwd.struct_size),
        (size_of::<fa_backward_args>(), size_of::<fa_forward_args>())
    );
    assert_eq!(
        (b.dout, b.dq, b.dk, b.dv),
        (fa_tensor::default(), fa_tensor::default(), fa_tensor::default(), fa_tensor::default())
    );
    assert_eq!((b.dsinks, b.workspace, b.workspace_size, b.deterministic), (0, 0, 0, 0));
    // FA_CACHE_WARM_OPTIONS_INIT: struct_size, everything else 0 / NULL (AUTO is 0).
    let w = fa_cache_warm_options::default();
    assert_eq!(w.struct_size, size_of::<fa_cache_warm_options>());
    assert!(w.cache_dir.is_null() && w.sms.is_null() && w.presets.is_null() && w.specs.is_null());
    assert_eq!((w.num_sms, w.jobs, w.ptx_compiler), (0, 0, FA_PTX_COMPILER_AUTO));
    assert!(w.progress.is_none() && w.user.is_null());
    assert_eq!(fa_cache_warm_progress::default().struct_size, size_of::<fa_cache_warm_progress>());
}

#[test]
fn links_and_reports_version() {
    // The loaded library has the major version these declarations follow.
    let v = unsafe { fa_version_number() };
    assert_eq!(v / 10000, FLASHATTN_VERSION_MAJOR);
    let s = unsafe { std::ffi::CStr::from_ptr(fa_version_string()) };
    assert_eq!(s.to_str().unwrap(), format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100));
    let text = unsafe { std::ffi::CStr::from_ptr(fa_status_string(FA_ERROR_INVALID_ARGUMENT)) };
    assert_eq!(text.to_str().unwrap(), "invalid argument");
}
