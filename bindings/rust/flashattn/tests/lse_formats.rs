//! LSE interchange (fa_lse_format, C API 0.4) beyond
//! tests/features/lse_formats.cases (features.rs, which merges every
//! input/output pair and sets a bad lse_format): a bad lse_partial_format
//! through the raw C struct.
mod common;

use common::emulator;
use flashattn::{sys, Config, Status};

#[test]
fn bad_lse_format_is_invalid_argument() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(32).heads(2, 2).build().unwrap();
    let op = rt.alloc_from(&vec![0.5f32; 2 * 2 * 32]).unwrap();
    let lp = rt.alloc_from(&vec![0.0f32; 4]).unwrap();
    let mut o = rt.alloc(2 * 2 * 32).unwrap();
    o.fill_bytes(0xab).unwrap();
    let a = sys::fa_reduce_args {
        num_splits: 2,
        batch: 1,
        seqlen_q: 1,
        o_partial: op.as_ptr(),
        o_partial_stride: [64, 64, 64, 32, 1],
        lse_partial: lp.as_ptr(),
        lse_partial_stride: [2, 2, 1, 1],
        o: sys::fa_tensor { data: o.as_ptr(), stride: [64, 64, 32, 1] },
        lse_partial_format: 2,
        ..Default::default()
    };
    // SAFETY: valid handles; the call is rejected before any memory access.
    let st = unsafe { sys::fa_decode_reduce(rt.as_raw(), cfg.as_raw(), &a, std::ptr::null_mut()) };
    assert_eq!(st, sys::FA_ERROR_INVALID_ARGUMENT);
    let msg =
        unsafe { std::ffi::CStr::from_ptr(sys::fa_last_error()) }.to_string_lossy().into_owned();
    assert!(msg.contains("lse_partial_format must be an fa_lse_format"), "{msg}");
    assert!(o.to_vec::<u8>().unwrap().iter().all(|&x| x == 0xab), "nothing written");
    assert_eq!(Status::from_code(st), Status::InvalidArgument);
}
