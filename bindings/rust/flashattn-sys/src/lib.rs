//! Raw declarations of the flashattn C API, written by hand from
//! `include/flashattn.h` (version 0.8). Every function and struct of the header
//! is here, with the same names.
//!
//! - Opaque handles are zero-sized `#[repr(C)]` structs used behind pointers.
//! - C enums are `c_int` type aliases with constants, never Rust enums: a value
//!   read back from C that is not a known variant stays a plain integer.
//! - `Default` on each struct with `struct_size` gives the header's `FA_*_INIT`
//!   value (`struct_size = size_of::<Self>()`).
//!
//! The layout test (tests/layout.rs) compiles a C program against the real
//! header and compares every size and field offset with these definitions.
#![allow(non_camel_case_types)]
#![no_std]

use core::ffi::{c_char, c_int, c_void};
use core::mem::size_of;

pub const FLASHATTN_VERSION_MAJOR: u32 = 0;
pub const FLASHATTN_VERSION_MINOR: u32 = 9;
pub const FLASHATTN_VERSION_PATCH: u32 = 0;
/// MAJOR * 10000 + MINOR * 100 + PATCH of the header these declarations follow.
pub const FLASHATTN_VERSION_NUMBER: u32 =
    FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH;

/// Largest seqlen_q, seqlen_k and seqlen_k_max the kernels accept.
pub const FA_MAX_SEQLEN: i32 = 1 << 30;

// ---------------------------------------------------------------------------
// Status

pub type fa_status = c_int;
pub const FA_SUCCESS: fa_status = 0;
pub const FA_ERROR_INVALID_ARGUMENT: fa_status = 1;
pub const FA_ERROR_UNSUPPORTED: fa_status = 2;
pub const FA_ERROR_OUT_OF_MEMORY: fa_status = 3;
pub const FA_ERROR_NO_DRIVER: fa_status = 4;
pub const FA_ERROR_NO_DEVICE: fa_status = 5;
pub const FA_ERROR_CUDA: fa_status = 6;
pub const FA_ERROR_COMPILE: fa_status = 7;
pub const FA_ERROR_LAUNCH: fa_status = 8;
pub const FA_ERROR_RUNTIME_POISONED: fa_status = 9;
pub const FA_ERROR_BUFFER_TOO_SMALL: fa_status = 10;
pub const FA_ERROR_INTERNAL: fa_status = 11;
pub const FA_ERROR_CACHE: fa_status = 12;
/// Sentinel, never returned.
pub const FA_STATUS_LAST: fa_status = 13;

// ---------------------------------------------------------------------------
// Enumerations

pub type fa_dtype = c_int;
pub const FA_DTYPE_FP16: fa_dtype = 1;
pub const FA_DTYPE_BF16: fa_dtype = 2;
pub const FA_DTYPE_FP32: fa_dtype = 3;
/// Since 0.5: fp8 e4m3 (only as fa_config_desc.kv_dtype and, since 0.6, q_dtype).
pub const FA_DTYPE_FP8_E4M3: fa_dtype = 4;
/// Since 0.5: fp8 e5m2 (only as fa_config_desc.kv_dtype and, since 0.6, q_dtype).
pub const FA_DTYPE_FP8_E5M2: fa_dtype = 5;

pub type fa_backend = c_int;
pub const FA_BACKEND_AUTO: fa_backend = 0;
pub const FA_BACKEND_CUDA: fa_backend = 1;
pub const FA_BACKEND_EMULATOR: fa_backend = 2;

pub type fa_kernel_kind = c_int;
pub const FA_KERNEL_FORWARD: fa_kernel_kind = 0;
pub const FA_KERNEL_DECODE: fa_kernel_kind = 1;
pub const FA_KERNEL_REDUCE: fa_kernel_kind = 2;
/// Since 0.9: fa_backward's three kernels, in its launch order.
pub const FA_KERNEL_BACKWARD_PRE: fa_kernel_kind = 3;
pub const FA_KERNEL_BACKWARD: fa_kernel_kind = 4;
pub const FA_KERNEL_BACKWARD_POST: fa_kernel_kind = 5;

pub type fa_cache_mode = c_int;
pub const FA_CACHE_DEFAULT: fa_cache_mode = 0;
pub const FA_CACHE_DISK: fa_cache_mode = 1;
pub const FA_CACHE_MEMORY: fa_cache_mode = 2;

/// How K and V are addressed (since 0.3); stored as int32 in fa_kv_cache_layout.
pub type fa_kv_layout = c_int;
pub const FA_KV_CONTIGUOUS: fa_kv_layout = 0;
pub const FA_KV_PAGED: fa_kv_layout = 1;
pub const FA_KV_PTR_ARRAY: fa_kv_layout = 2;

/// The logarithm base of an LSE (since 0.4); stored as int32 in
/// fa_reduce_args and fa_generate_options.
pub type fa_lse_format = c_int;
/// ln of the softmax denominator (flashattn, FlashAttention).
pub const FA_LSE_NATURAL: fa_lse_format = 0;
/// log2 of it: lse2 = lse * log2(e) (FlashInfer).
pub const FA_LSE_BASE2: fa_lse_format = 1;

// ---------------------------------------------------------------------------
// Opaque handles

/// A device binding (CUDA context or emulator), its kernels and cache.
#[repr(C)]
pub struct fa_runtime {
    _private: [u8; 0],
}

/// A validated, immutable attention problem family.
#[repr(C)]
pub struct fa_config {
    _private: [u8; 0],
}

// ---------------------------------------------------------------------------
// Structs

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_runtime_options {
    pub struct_size: usize,
    pub backend: fa_backend,
    pub device: i32,
    pub cache_mode: fa_cache_mode,
    pub cache_dir: *const c_char,
    pub emulator_sm: i32,
    /// Since 0.6: an `fa_ptx_compiler` (`FA_PTX_COMPILER_AUTO` / `_OFF`).
    pub ptx_compiler: i64,
    /// Since 0.7: a caller's `fa_kernel_store` (C callbacks, see flashattn.h),
    /// or null: `FLASHATTN_KERNEL_STORE` (the Redis plugin) or none. Opaque
    /// here: Rust callers reach the Redis tier through the variable.
    pub kernel_store: *const c_void,
}

/// `fa_ptx_compiler`: the PTX compiler plugin when present and trusted, or never.
pub const FA_PTX_COMPILER_AUTO: i64 = 0;
pub const FA_PTX_COMPILER_OFF: i64 = 1;

/// struct_size of fa_runtime_options in flashattn 0.1 to 0.5 (before `ptx_compiler`).
pub const FA_RUNTIME_OPTIONS_SIZE_0_5: usize =
    core::mem::offset_of!(fa_runtime_options, ptx_compiler);
/// struct_size of fa_runtime_options in flashattn 0.6 (before `kernel_store`).
pub const FA_RUNTIME_OPTIONS_SIZE_0_6: usize =
    core::mem::offset_of!(fa_runtime_options, kernel_store);

impl Default for fa_runtime_options {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            backend: FA_BACKEND_AUTO,
            device: 0,
            cache_mode: FA_CACHE_DEFAULT,
            cache_dir: core::ptr::null(),
            emulator_sm: 0,
            ptx_compiler: FA_PTX_COMPILER_AUTO,
            kernel_store: core::ptr::null(),
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_runtime_info {
    pub struct_size: usize,
    pub backend: fa_backend,
    pub sm: i32,
    pub num_sms: i32,
    pub driver_version: i32,
    pub device_name: [c_char; 128],
}

impl Default for fa_runtime_info {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            backend: FA_BACKEND_AUTO,
            sm: 0,
            num_sms: 0,
            driver_version: 0,
            device_name: [0; 128],
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_config_desc {
    pub struct_size: usize,
    pub dtype: fa_dtype,
    pub head_dim: i32,
    pub head_dim_v: i32,
    pub num_heads_q: i32,
    pub num_heads_kv: i32,
    pub causal: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub softmax_scale: f32,
    pub softcap: f32,
    /// Since 0.5: 0 = dtype, or FA_DTYPE_FP8_E4M3 / FA_DTYPE_FP8_E5M2: the
    /// KV cache holds fp8 bytes (fa_decode only, sm_89+). 64-bit so that
    /// 0.4's struct, padding included, ends where it begins.
    pub kv_dtype: i64,
    /// Since 0.6: 0 = dtype, or FA_DTYPE_FP8_E4M3 / FA_DTYPE_FP8_E5M2 with an
    /// fp8 kv_dtype: Q is fp8 bytes too, the fp8 forward (fa_launch only,
    /// sm_89+; O in dtype, fp16 or bf16).
    pub q_dtype: i64,
}

/// struct_size of fa_config_desc in flashattn 0.4 (ends before `kv_dtype`).
pub const FA_CONFIG_DESC_SIZE_0_4: usize = core::mem::offset_of!(fa_config_desc, kv_dtype);
/// struct_size of fa_config_desc in flashattn 0.5 (ends before `q_dtype`).
pub const FA_CONFIG_DESC_SIZE_0_5: usize = core::mem::offset_of!(fa_config_desc, q_dtype);

impl Default for fa_config_desc {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            dtype: FA_DTYPE_FP16,
            head_dim: 0,
            head_dim_v: 0,
            num_heads_q: 0,
            num_heads_kv: 0,
            causal: 0,
            window_left: -1,
            window_right: -1,
            softmax_scale: 0.0,
            softcap: 0.0,
            kv_dtype: 0,
            q_dtype: 0,
        }
    }
}

/// A 4-D tensor view: device pointer and strides in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fa_tensor {
    pub data: u64,
    pub stride: [i64; 4],
}

/// A KV cache's layout (since 0.3); `Default` is FA_KV_CACHE_LAYOUT_INIT
/// (contiguous). Field meanings as in flashattn.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fa_kv_cache_layout {
    /// An fa_kv_layout value.
    pub layout: i32,
    pub page_size: i32,
    pub num_pages: i32,
    pub max_pages_per_seq: i32,
    /// int32 [batch, max_pages_per_seq], rows block_table_stride elements apart.
    pub block_table: u64,
    pub block_table_stride: i64,
    /// uint64 [batch] each.
    pub k_ptrs: u64,
    pub v_ptrs: u64,
}

/// The launch shape fa_generate_for generates for (since 0.3); zero =
/// fa_generate's (fixed length, contiguous K/V).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct fa_generate_options {
    pub struct_size: usize,
    /// An fa_kv_layout value.
    pub kv_layout: i32,
    pub page_size: i32,
    pub varlen: i32,
    pub seqused_k: i32,
    /// Since 0.4: decode with a tree mask (0 or 1).
    pub tree_mask: i32,
    /// Since 0.4: reduce's fa_lse_format of the partial LSEs and of the LSE.
    pub lse_partial_format: i32,
    pub lse_format: i32,
    /// Since 0.4.1: forward or reduce with attention sinks (0 or 1; 64-bit
    /// so that 0.4.0's struct, padding included, ends where it begins).
    pub sinks: i64,
    /// Since 0.5: forward or decode with ALiBi (0 or 1).
    pub alibi: i32,
    /// Since 0.5: decode with the KV append (k_new/v_new set; 0 or 1).
    pub append_kv: i32,
    /// Since 0.5: with append_kv, 0 = no rotary, 1 = GPT-NeoX pairs, 2 =
    /// GPT-J (interleaved) pairs.
    pub rotary: i32,
    /// Since 0.5: fa_dtype of rotary_cos/sin (FP32 or 0, or the cfg dtype).
    pub rotary_dtype: i32,
    /// Since 0.5.1: decode with V read from the K tile (v_cache is k_cache's
    /// memory and strides: MLA's latent cache; 0 or 1).
    pub v_in_k: i32,
}

/// struct_size of fa_generate_options in flashattn 0.3 (ends before `tree_mask`).
pub const FA_GENERATE_OPTIONS_SIZE_0_3: usize =
    core::mem::offset_of!(fa_generate_options, tree_mask);
/// struct_size of fa_generate_options in flashattn 0.4.0 (ends before `sinks`).
pub const FA_GENERATE_OPTIONS_SIZE_0_4: usize = core::mem::offset_of!(fa_generate_options, sinks);
/// struct_size of fa_generate_options in flashattn 0.4.1 (ends before `alibi`).
pub const FA_GENERATE_OPTIONS_SIZE_0_4_1: usize = core::mem::offset_of!(fa_generate_options, alibi);
/// struct_size of fa_generate_options in flashattn 0.5 (ends before `v_in_k`).
pub const FA_GENERATE_OPTIONS_SIZE_0_5: usize = core::mem::offset_of!(fa_generate_options, v_in_k);

impl Default for fa_generate_options {
    fn default() -> Self {
        fa_generate_options {
            struct_size: size_of::<Self>(),
            kv_layout: 0,
            page_size: 0,
            varlen: 0,
            seqused_k: 0,
            tree_mask: 0,
            lse_partial_format: 0,
            lse_format: 0,
            sinks: 0,
            alibi: 0,
            append_kv: 0,
            rotary: 0,
            rotary_dtype: 0,
            v_in_k: 0,
        }
    }
}

/// Memory counters of one emulated launch (fa_emulator_profile).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fa_emu_mem_counters {
    pub global_load_requests: u64,
    pub global_load_sectors: u64,
    pub global_load_bytes: u64,
    pub cp_async_requests: u64,
    pub cp_async_sectors: u64,
    pub cp_async_bytes: u64,
    pub global_store_requests: u64,
    pub global_store_sectors: u64,
    pub global_store_bytes: u64,
    pub shared_requests: u64,
    pub shared_wavefronts: u64,
    pub shared_bank_conflicts: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_emu_profile {
    pub struct_size: usize,
    /// Entry name of the launch, NUL-terminated.
    pub kernel: [c_char; 128],
    pub total: fa_emu_mem_counters,
    pub main_loop: fa_emu_mem_counters,
    pub main_loop_first_line: u32,
    pub main_loop_last_line: u32,
    pub main_loop_worst_conflict_line: u32,
    pub main_loop_worst_sector_line: u32,
}

impl Default for fa_emu_profile {
    fn default() -> Self {
        fa_emu_profile {
            struct_size: size_of::<Self>(),
            kernel: [0; 128],
            total: fa_emu_mem_counters::default(),
            main_loop: fa_emu_mem_counters::default(),
            main_loop_first_line: 0,
            main_loop_last_line: 0,
            main_loop_worst_conflict_line: 0,
            main_loop_worst_sector_line: 0,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_forward_args {
    pub struct_size: usize,
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub q: fa_tensor,
    pub k: fa_tensor,
    pub v: fa_tensor,
    pub o: fa_tensor,
    pub lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    /// Since 0.3.
    pub kv: fa_kv_cache_layout,
    pub seqused_k: u64,
    /// Since 0.4.1: attention sinks (gpt-oss), fp32 [num_heads_q] natural-log
    /// logits in each row's softmax denominator, 4-byte aligned, or 0 = none.
    pub sinks: u64,
    /// Since 0.5: ALiBi slopes, fp32, the slope of (b, h) at
    /// alibi_slopes[b * alibi_slopes_stride + h], 4-byte aligned, or 0 = none.
    pub alibi_slopes: u64,
    /// Elements between sequences' slopes (>= num_heads_q), or 0 = one row.
    pub alibi_slopes_stride: i64,
    /// Since 0.5: fp8 KV descales (fp32, or 0 = 1.0), (b, h_kv) at
    /// b * descale_stride[0] + h_kv * descale_stride[1]; used by the fp8
    /// forward (fa_config_desc.q_dtype) since 0.6.
    pub k_descale: u64,
    pub v_descale: u64,
    pub descale_stride: [i64; 2],
    /// Since 0.6: the fp8 Q's descale (fa_config_desc.q_dtype), as k_descale
    /// (the same descale_stride; a query head uses its KV head's), or 0 = 1.0.
    pub q_descale: u64,
    /// Since 0.8: the sm_90a forward's scratch (device memory of
    /// fa_forward_workspace_size bytes, zeroed once by the caller; one per
    /// stream), or 0 = none: the persistent kernel's work counter (8-byte
    /// aligned; every launch leaves it zero) and, from byte 256, split-KV
    /// partial states (256-byte aligned, else the launch runs unsplit).
    pub workspace: u64,
    /// Bytes at workspace (>= 8 with one, 0 without).
    pub workspace_size: usize,
}

/// struct_size of fa_forward_args in flashattn 0.2 (ends before `kv`).
pub const FA_FORWARD_ARGS_SIZE_0_2: usize = core::mem::offset_of!(fa_forward_args, kv);
/// struct_size of fa_forward_args in flashattn 0.3 and 0.4.0 (ends before `sinks`).
pub const FA_FORWARD_ARGS_SIZE_0_4: usize = core::mem::offset_of!(fa_forward_args, sinks);
/// struct_size of fa_forward_args in flashattn 0.4.1 (ends before `alibi_slopes`).
pub const FA_FORWARD_ARGS_SIZE_0_4_1: usize = core::mem::offset_of!(fa_forward_args, alibi_slopes);
/// struct_size of fa_forward_args in flashattn 0.5 (ends before `q_descale`).
pub const FA_FORWARD_ARGS_SIZE_0_5: usize = core::mem::offset_of!(fa_forward_args, q_descale);
/// struct_size of fa_forward_args in flashattn 0.6 and 0.7 (ends before `workspace`).
pub const FA_FORWARD_ARGS_SIZE_0_7: usize = core::mem::offset_of!(fa_forward_args, workspace);

impl Default for fa_forward_args {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            batch: 0,
            seqlen_q: 0,
            seqlen_k: 0,
            q: fa_tensor::default(),
            k: fa_tensor::default(),
            v: fa_tensor::default(),
            o: fa_tensor::default(),
            lse: 0,
            cu_seqlens_q: 0,
            cu_seqlens_k: 0,
            kv: fa_kv_cache_layout::default(),
            seqused_k: 0,
            sinks: 0,
            alibi_slopes: 0,
            alibi_slopes_stride: 0,
            k_descale: 0,
            v_descale: 0,
            descale_stride: [0; 2],
            q_descale: 0,
            workspace: 0,
            workspace_size: 0,
        }
    }
}

/// Since 0.9: the arguments of fa_backward (the training backward).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_backward_args {
    pub struct_size: usize,
    /// The forward call's arguments as given to fa_launch, with `o` its output
    /// O and `lse` its LSE (both required); contiguous K/V only; its
    /// workspace is ignored.
    pub fwd: fa_forward_args,
    /// dO, like fwd.o.
    pub dout: fa_tensor,
    /// Written: like fwd.q.
    pub dq: fa_tensor,
    /// Written: like fwd.k (summed over each KV head's query heads).
    pub dk: fa_tensor,
    /// Written: like fwd.v.
    pub dv: fa_tensor,
    /// fp32 [num_heads_q], written, with fwd.sinks (required then); else 0.
    pub dsinks: u64,
    /// fa_backward_workspace_size bytes, 256-byte aligned; contents on entry
    /// do not matter; not shared by launches that may run at the same time.
    pub workspace: u64,
    /// Bytes at workspace.
    pub workspace_size: usize,
    /// 1: the same bits on every run (dQ summed in a fixed order); 0: atomics.
    pub deterministic: i32,
}

impl Default for fa_backward_args {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            fwd: fa_forward_args::default(),
            dout: fa_tensor::default(),
            dq: fa_tensor::default(),
            dk: fa_tensor::default(),
            dv: fa_tensor::default(),
            dsinks: 0,
            workspace: 0,
            workspace_size: 0,
            deterministic: 0,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_decode_args {
    pub struct_size: usize,
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k_max: i32,
    pub q: fa_tensor,
    pub k_cache: fa_tensor,
    pub v_cache: fa_tensor,
    pub cache_seqlens: u64,
    pub num_splits: i32,
    pub workspace: u64,
    pub workspace_size: usize,
    pub o: fa_tensor,
    pub lse: u64,
    /// Since 0.3.
    pub kv: fa_kv_cache_layout,
    pub batch_invariant: i32,
    /// Since 0.4: uint8 bits [batch, seqlen_q, row] of the tree among the
    /// new tokens (bit j % 8 of byte j / 8 of row (b, i): query i sees new
    /// token j), or 0 = none.
    pub tree_mask: u64,
    /// Bytes between sequences (0 = one mask for the batch) and query rows.
    pub tree_mask_stride: [i64; 2],
    /// Since 0.4.1: attention sinks as in fa_forward_args (added once per
    /// row in the combine: needs `o.data != 0`), or 0.
    pub sinks: u64,
    /// Since 0.5: ALiBi slopes as in fa_forward_args, or 0.
    pub alibi_slopes: u64,
    pub alibi_slopes_stride: i64,
    /// Since 0.5: fp8 KV cache descales (fp32, or 0 = 1.0), (b, h_kv) at
    /// b * descale_stride[0] + h_kv * descale_stride[1] (elements).
    pub k_descale: u64,
    pub v_descale: u64,
    pub descale_stride: [i64; 2],
    /// Since 0.5: KV append with rotary embedding (as flash_attn_with_kvcache).
    /// New keys [batch, seqlen_new, num_heads_kv, head_dim] cfg dtype, written
    /// into the cache at cache_seqlens[b] (then the length BEFORE the append),
    /// or data 0 = no append (every field below 0).
    pub k_new: fa_tensor,
    /// New values [batch, seqlen_new, num_heads_kv, head_dim_v].
    pub v_new: fa_tensor,
    /// 1..seqlen_k_max with k_new.
    pub seqlen_new: i32,
    /// 0 = no rotary; else a multiple of 16, <= head_dim.
    pub rotary_dim: i32,
    /// [seqlen_ro, rotary_dim / 2] contiguous, fp32 or the cfg dtype.
    pub rotary_cos: u64,
    pub rotary_sin: u64,
    /// Rows of rotary_cos/sin (>= 1; later positions read the last row).
    pub seqlen_ro: i32,
    /// 1 = GPT-J pairs (2i, 2i+1), 0 = GPT-NeoX pairs (i, i + rotary_dim / 2).
    pub rotary_interleaved: i32,
    /// fa_dtype of the tables: FA_DTYPE_FP32 or the cfg dtype; 0 = FP32.
    pub rotary_dtype: i32,
    /// Must be 0.
    pub rotary_reserved: i32,
    /// int32 [batch, max(seqlen_q, seqlen_new)] positions, or 0.
    pub rotary_positions: u64,
    /// Elements between sequences of rotary_positions (>= 0).
    pub rotary_positions_stride: i64,
    // Since 0.8 (FA_DECODE_ARGS_SIZE_0_5 ends before them).
    /// int32 counters, zeroed by the caller once (every fa_decode leaves
    /// them zero), at least FA_DECODE_SPLIT_COUNTERS of them: the combine
    /// fused into the decode kernel; 0 = a second launch.
    pub split_counters: u64,
    /// Bytes at split_counters (0 when it is 0).
    pub split_counters_size: usize,
}

/// struct_size of fa_decode_args in flashattn 0.2 (ends before `kv`).
pub const FA_DECODE_ARGS_SIZE_0_2: usize = core::mem::offset_of!(fa_decode_args, kv);
/// struct_size of fa_decode_args in flashattn 0.3 (ends before `tree_mask`).
pub const FA_DECODE_ARGS_SIZE_0_3: usize = core::mem::offset_of!(fa_decode_args, tree_mask);
/// struct_size of fa_decode_args in flashattn 0.4.0 (ends before `sinks`).
pub const FA_DECODE_ARGS_SIZE_0_4: usize = core::mem::offset_of!(fa_decode_args, sinks);
/// struct_size of fa_decode_args in flashattn 0.4.1 (ends before `alibi_slopes`).
pub const FA_DECODE_ARGS_SIZE_0_4_1: usize = core::mem::offset_of!(fa_decode_args, alibi_slopes);
/// struct_size of fa_decode_args in flashattn 0.5 to 0.7 (ends before `split_counters`).
pub const FA_DECODE_ARGS_SIZE_0_5: usize = core::mem::offset_of!(fa_decode_args, split_counters);
/// The int32 counters fa_decode_args.split_counters must hold (the C
/// macro FA_DECODE_SPLIT_COUNTERS).
pub const fn fa_decode_split_counters(
    batch: usize,
    num_heads_q: usize,
    num_heads_kv: usize,
    seqlen_q: usize,
) -> usize {
    batch * num_heads_kv * ((num_heads_q / num_heads_kv * seqlen_q + 15) / 16)
}
/// Keys per split under batch_invariant.
pub const FA_DECODE_INVARIANT_SPLIT: i32 = 2048;

impl Default for fa_decode_args {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            batch: 0,
            seqlen_q: 0,
            seqlen_k_max: 0,
            q: fa_tensor::default(),
            k_cache: fa_tensor::default(),
            v_cache: fa_tensor::default(),
            cache_seqlens: 0,
            num_splits: 0,
            workspace: 0,
            workspace_size: 0,
            o: fa_tensor::default(),
            lse: 0,
            kv: fa_kv_cache_layout::default(),
            batch_invariant: 0,
            tree_mask: 0,
            tree_mask_stride: [0; 2],
            sinks: 0,
            alibi_slopes: 0,
            alibi_slopes_stride: 0,
            k_descale: 0,
            v_descale: 0,
            descale_stride: [0; 2],
            k_new: fa_tensor::default(),
            v_new: fa_tensor::default(),
            seqlen_new: 0,
            rotary_dim: 0,
            rotary_cos: 0,
            rotary_sin: 0,
            seqlen_ro: 0,
            rotary_interleaved: 0,
            rotary_dtype: 0,
            rotary_reserved: 0,
            rotary_positions: 0,
            rotary_positions_stride: 0,
            split_counters: 0,
            split_counters_size: 0,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_reduce_args {
    pub struct_size: usize,
    pub num_splits: i32,
    pub batch: i32,
    pub seqlen_q: i32,
    pub o_partial: u64,
    pub o_partial_stride: [i64; 5],
    pub lse_partial: u64,
    pub lse_partial_stride: [i64; 4],
    pub o: fa_tensor,
    pub lse: u64,
    /// Since 0.4: fa_lse_format of lse_partial and of lse.
    pub lse_partial_format: i32,
    pub lse_format: i32,
    /// Since 0.4.1: attention sinks fp32 [num_heads_q] (natural logs), one
    /// more state per row with O = 0, or 0.
    pub sinks: u64,
}

/// struct_size of fa_reduce_args in flashattn 0.3 (ends before `lse_partial_format`).
pub const FA_REDUCE_ARGS_SIZE_0_3: usize =
    core::mem::offset_of!(fa_reduce_args, lse_partial_format);
/// struct_size of fa_reduce_args in flashattn 0.4.0 (ends before `sinks`).
pub const FA_REDUCE_ARGS_SIZE_0_4: usize = core::mem::offset_of!(fa_reduce_args, sinks);

impl Default for fa_reduce_args {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            num_splits: 0,
            batch: 0,
            seqlen_q: 0,
            o_partial: 0,
            o_partial_stride: [0; 5],
            lse_partial: 0,
            lse_partial_stride: [0; 4],
            o: fa_tensor::default(),
            lse: 0,
            lse_partial_format: 0,
            lse_format: 0,
            sinks: 0,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_cache_stats {
    pub struct_size: usize,
    pub memory_hits: u64,
    pub disk_hits: u64,
    pub misses: u64,
    pub compiles: u64,
    pub discarded: u64,
    pub entries: u64,
    pub bytes: u64,
    pub persistent: i32,
    pub path: [c_char; 512],
    pub note: [c_char; 256],
    pub collisions: u64,
    pub evicted: u64,
    pub resets: u64,
    pub leases: u64,
    pub leases_reclaimed: u64,
    pub lease_waits: u64,
    pub lease_timeouts: u64,
    pub max_bytes: u64,
    /// Since 0.6: an `fa_compiler_mode`.
    pub compiler_mode: i32,
    pub compiler: [c_char; 128],
    pub compiler_note: [c_char; 256],
    pub cubin_refusals: u64,
    /// Since 0.7: the second tier (a kernel store); all 0 / "" without one.
    pub remote_hits: u64,
    pub remote_misses: u64,
    pub remote_puts: u64,
    pub remote_errors: u64,
    pub remote_discarded: u64,
    pub kernel_store: [c_char; 128],
    pub kernel_store_note: [c_char; 256],
}

/// `fa_compiler_mode`: how a runtime turns PTX into machine code.
pub type fa_compiler_mode = c_int;
pub const FA_COMPILER_NONE: fa_compiler_mode = 0;
pub const FA_COMPILER_DRIVER_JIT: fa_compiler_mode = 1;
pub const FA_COMPILER_PLUGIN: fa_compiler_mode = 2;

/// struct_size of fa_cache_stats in flashattn 0.6 (ends before `remote_hits`).
pub const FA_CACHE_STATS_SIZE_0_6: usize = core::mem::offset_of!(fa_cache_stats, remote_hits);

/// struct_size of fa_cache_stats in flashattn 0.2 to 0.5 (ends before `compiler_mode`).
pub const FA_CACHE_STATS_SIZE_0_5: usize = core::mem::offset_of!(fa_cache_stats, compiler_mode);

/// struct_size of fa_cache_stats in flashattn 0.1 (ends before `collisions`).
pub const FA_CACHE_STATS_SIZE_0_1: usize = 840;

impl Default for fa_cache_stats {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            memory_hits: 0,
            disk_hits: 0,
            misses: 0,
            compiles: 0,
            discarded: 0,
            entries: 0,
            bytes: 0,
            persistent: 0,
            path: [0; 512],
            note: [0; 256],
            collisions: 0,
            evicted: 0,
            resets: 0,
            leases: 0,
            leases_reclaimed: 0,
            lease_waits: 0,
            lease_timeouts: 0,
            max_bytes: 0,
            compiler_mode: FA_COMPILER_NONE,
            compiler: [0; 128],
            compiler_note: [0; 256],
            cubin_refusals: 0,
            remote_hits: 0,
            remote_misses: 0,
            remote_puts: 0,
            remote_errors: 0,
            remote_discarded: 0,
            kernel_store: [0; 128],
            kernel_store_note: [0; 256],
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_cache_entry {
    pub struct_size: usize,
    pub key: [c_char; 33],
    pub spec: *const c_char,
    pub sm: i32,
    pub generator_version: u32,
    pub ptx_bytes: u64,
    pub cubin_bytes: u64,
    pub hits: u64,
    pub created: i64,
    pub last_used: i64,
    /// Since 0.6: what built the binary (valid during the callback only).
    pub compiler: *const c_char,
}

/// Called once per stored kernel by `fa_cache_list`; non-zero stops the walk.
pub type fa_cache_entry_fn =
    Option<unsafe extern "C" fn(entry: *const fa_cache_entry, user: *mut c_void) -> c_int>;

// ---------------------------------------------------------------------------
// Offline cache warming (since 0.7)

/// Counts of an `fa_cache_warm` call, so far (progress) or in all (result).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_cache_warm_progress {
    pub struct_size: usize,
    /// Distinct kernels asked for: (spec line, SM) pairs that SM runs.
    pub total: u64,
    /// Of which finished: built + present + failed.
    pub done: u64,
    /// Rows written.
    pub built: u64,
    /// Rows already there with this compiler's binary.
    pub present: u64,
    /// Kernels the compiler rejected (fa_last_error names the first).
    pub failed: u64,
    /// (spec line, SM) pairs that SM cannot run: not counted in total.
    pub skipped: u64,
    /// PTX + binary bytes of the rows written.
    pub bytes: u64,
    /// Wall time since the call began.
    pub seconds: f64,
    /// Progress: the kernel just finished (valid during the callback only); result: NULL.
    pub spec: *const c_char,
    /// Progress: its SM; result: 0.
    pub sm: i32,
    /// The PTX compiler plugin's version, or "" (PTX rows).
    pub compiler: [c_char; 128],
}

impl Default for fa_cache_warm_progress {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            total: 0,
            done: 0,
            built: 0,
            present: 0,
            failed: 0,
            skipped: 0,
            bytes: 0,
            seconds: 0.0,
            spec: core::ptr::null(),
            sm: 0,
            compiler: [0; 128],
        }
    }
}

/// Called by `fa_cache_warm` on the calling thread after each kernel (never concurrently).
pub type fa_cache_warm_progress_fn =
    Option<unsafe extern "C" fn(progress: *const fa_cache_warm_progress, user: *mut c_void)>;

/// Options of `fa_cache_warm`; `Default` is FA_CACHE_WARM_OPTIONS_INIT.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fa_cache_warm_options {
    pub struct_size: usize,
    /// The cache to fill, as fa_runtime_options.cache_dir (NULL: the default).
    pub cache_dir: *const c_char,
    /// The target SMs (80, 86, 87, 89, 90, 100, 103, 110, 120, 121).
    pub sms: *const i32,
    pub num_sms: i32,
    /// Kernels compiled at once; 0 = the online CPUs.
    pub jobs: i32,
    /// Comma-separated preset names, or NULL.
    pub presets: *const c_char,
    /// Kernel spec lines, or NULL; at least one of presets and specs.
    pub specs: *const c_char,
    /// An `fa_ptx_compiler`: AUTO builds cubins with the plugin when there is one; OFF writes PTX.
    pub ptx_compiler: i64,
    pub progress: fa_cache_warm_progress_fn,
    /// Passed to progress.
    pub user: *mut c_void,
}

impl Default for fa_cache_warm_options {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            cache_dir: core::ptr::null(),
            sms: core::ptr::null(),
            num_sms: 0,
            jobs: 0,
            presets: core::ptr::null(),
            specs: core::ptr::null(),
            ptx_compiler: FA_PTX_COMPILER_AUTO,
            progress: None,
            user: core::ptr::null_mut(),
        }
    }
}

// ---------------------------------------------------------------------------
// Functions

extern "C" {
    pub fn fa_status_string(status: fa_status) -> *const c_char;
    pub fn fa_last_error() -> *const c_char;
    pub fn fa_version_number() -> u32;
    pub fn fa_version_string() -> *const c_char;

    pub fn fa_runtime_create(
        options: *const fa_runtime_options,
        out: *mut *mut fa_runtime,
    ) -> fa_status;
    pub fn fa_runtime_destroy(rt: *mut fa_runtime);
    pub fn fa_runtime_get_info(rt: *const fa_runtime, info: *mut fa_runtime_info) -> fa_status;

    pub fn fa_malloc(rt: *mut fa_runtime, bytes: usize, ptr: *mut u64) -> fa_status;
    pub fn fa_free(rt: *mut fa_runtime, ptr: u64) -> fa_status;
    pub fn fa_memcpy_htod(
        rt: *mut fa_runtime,
        dst: u64,
        src: *const c_void,
        bytes: usize,
    ) -> fa_status;
    pub fn fa_memcpy_dtoh(
        rt: *mut fa_runtime,
        dst: *mut c_void,
        src: u64,
        bytes: usize,
    ) -> fa_status;
    pub fn fa_memset(rt: *mut fa_runtime, dst: u64, value: u8, bytes: usize) -> fa_status;
    pub fn fa_synchronize(rt: *mut fa_runtime, stream: *mut c_void) -> fa_status;

    pub fn fa_config_create(desc: *const fa_config_desc, out: *mut *mut fa_config) -> fa_status;
    pub fn fa_config_destroy(cfg: *mut fa_config);

    pub fn fa_generate(
        cfg: *const fa_config,
        kind: fa_kernel_kind,
        sm: i32,
        buf: *mut c_char,
        buf_size: usize,
        ptx_size: *mut usize,
    ) -> fa_status;

    pub fn fa_generate_for(
        cfg: *const fa_config,
        kind: fa_kernel_kind,
        sm: i32,
        opts: *const fa_generate_options,
        buf: *mut c_char,
        buf_size: usize,
        ptx_size: *mut usize,
    ) -> fa_status;

    pub fn fa_emulator_profile(rt: *mut fa_runtime, out: *mut fa_emu_profile) -> fa_status;

    pub fn fa_launch(
        rt: *mut fa_runtime,
        cfg: *const fa_config,
        args: *const fa_forward_args,
        stream: *mut c_void,
    ) -> fa_status;

    /// Since 0.8: the bytes of fa_forward_args.workspace fa_launch uses (8 or 0).
    pub fn fa_forward_workspace_size(
        rt: *const fa_runtime,
        cfg: *const fa_config,
        args: *const fa_forward_args,
        bytes: *mut usize,
    ) -> fa_status;
    /// Since 0.9: the bytes of fa_backward_args.workspace fa_backward uses.
    pub fn fa_backward_workspace_size(
        rt: *const fa_runtime,
        cfg: *const fa_config,
        args: *const fa_backward_args,
        bytes: *mut usize,
    ) -> fa_status;
    /// Since 0.9: dQ, dK, dV (and dsinks) of the forward in args->fwd.
    pub fn fa_backward(
        rt: *mut fa_runtime,
        cfg: *const fa_config,
        args: *const fa_backward_args,
        stream: *mut c_void,
    ) -> fa_status;
    pub fn fa_decode_workspace_size(
        rt: *const fa_runtime,
        cfg: *const fa_config,
        args: *const fa_decode_args,
        bytes: *mut usize,
        num_splits: *mut i32,
    ) -> fa_status;
    pub fn fa_decode(
        rt: *mut fa_runtime,
        cfg: *const fa_config,
        args: *const fa_decode_args,
        stream: *mut c_void,
    ) -> fa_status;
    pub fn fa_decode_reduce(
        rt: *mut fa_runtime,
        cfg: *const fa_config,
        args: *const fa_reduce_args,
        stream: *mut c_void,
    ) -> fa_status;

    pub fn fa_cache_stats_get(rt: *mut fa_runtime, stats: *mut fa_cache_stats) -> fa_status;
    pub fn fa_cache_list(rt: *mut fa_runtime, f: fa_cache_entry_fn, user: *mut c_void)
        -> fa_status;
    pub fn fa_cache_clear(rt: *mut fa_runtime) -> fa_status;

    pub fn fa_cache_warm(
        options: *const fa_cache_warm_options,
        result: *mut fa_cache_warm_progress,
    ) -> fa_status;
    pub fn fa_cache_warm_presets() -> *const c_char;
    pub fn fa_cache_warm_preset(name: *const c_char) -> *const c_char;
}
