//! Every call of the safe API on the emulator, and failures mapped to Error
//! with the library's status and message.
mod common;

use common::{emulator, temp_dir, Rng};
use flashattn::{
    sys, Backend, CacheMode, Config, DecodeArgs, Dtype, Error, ForwardArgs, KernelKind,
    RawForwardArgs, RawTensor, ReduceArgs, Runtime, Status, Tensor, TensorMut, View,
};
use std::sync::Arc;

fn expect_err<T: std::fmt::Debug>(r: flashattn::Result<T>, status: Status, text: &str) -> Error {
    let e = r.expect_err("call should fail");
    assert_eq!(e.status, status, "{e}");
    assert!(e.message.contains(text), "message {:?} lacks {:?}", e.message, text);
    e
}

fn small_cfg() -> Config {
    Config::builder().head_dim(32).heads(2, 1).build().unwrap()
}

/// Buffers for a [1, 16, heads, 32] problem of small_cfg().
struct Bufs {
    q: flashattn::DeviceBuffer,
    k: flashattn::DeviceBuffer,
    v: flashattn::DeviceBuffer,
    o: flashattn::DeviceBuffer,
}

const S: usize = 16;
const QSHAPE: [usize; 4] = [1, S, 2, 32];
const KSHAPE: [usize; 4] = [1, S, 1, 32];

fn bufs(rt: &Runtime, seed: u64) -> Bufs {
    let mut rng = Rng::new(seed);
    Bufs {
        q: rt.alloc_from(&rng.f16_tensor(S * 2 * 32).0).unwrap(),
        k: rt.alloc_from(&rng.f16_tensor(S * 32).0).unwrap(),
        v: rt.alloc_from(&rng.f16_tensor(S * 32).0).unwrap(),
        o: rt.alloc(2 * S * 2 * 32 * 2).unwrap(), // twice the size needed
    }
}

fn fwd<'a>(b: &'a mut Bufs) -> ForwardArgs<'a> {
    ForwardArgs {
        batch: 1,
        seqlen_q: S,
        seqlen_k: S,
        q: Tensor::contiguous(&b.q, QSHAPE),
        k: Tensor::contiguous(&b.k, KSHAPE),
        v: Tensor::contiguous(&b.v, KSHAPE),
        o: TensorMut::contiguous(&mut b.o, QSHAPE),
        lse: None,
        workspace: None,
    }
}

#[test]
fn version_and_status_text() {
    assert_eq!(flashattn::version_number() / 10000, sys::FLASHATTN_VERSION_MAJOR);
    assert_eq!(flashattn::version_string().split('.').count(), 3);
    for code in 1..=12 {
        let s = Status::from_code(code);
        assert!(!matches!(s, Status::Other(_)), "code {code} unknown");
        assert_eq!(s.code(), code);
        assert_ne!(s.as_str(), "unknown status");
    }
    assert_eq!(Status::from_code(99), Status::Other(99));
    assert_eq!(Status::Other(99).as_str(), "unknown status");
    assert_eq!(Status::InvalidArgument.to_string(), "invalid argument");
}

#[test]
fn runtime_info_on_the_emulator() {
    let rt = emulator();
    let info = rt.info().unwrap();
    assert_eq!(info.backend, Backend::Emulator);
    assert_eq!(info.backend_code, sys::FA_BACKEND_EMULATOR);
    assert_eq!(info.sm, 80);
    assert!(info.num_sms >= 1);
    assert_eq!(info.driver_version, 0);
    assert!(!info.device_name.is_empty());
    let rt86 = Runtime::builder()
        .backend(Backend::Emulator)
        .emulator_sm(86)
        .cache_mode(CacheMode::Memory)
        .build()
        .unwrap();
    assert_eq!(rt86.info().unwrap().sm, 86);
    rt.synchronize().unwrap();
    // SAFETY: NULL is the default stream.
    unsafe { rt.synchronize_stream(std::ptr::null_mut()) }.unwrap();
}

#[test]
fn runtime_options_errors() {
    expect_err(
        Runtime::builder().backend(Backend::Emulator).emulator_sm(75).build(),
        Status::Unsupported,
        "fa_runtime_create: emulator_sm must be 0 or one of 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, got 75",
    );
    expect_err(
        Runtime::builder().backend(Backend::Emulator).device(-1).build(),
        Status::InvalidArgument,
        "device must be >= 0, got -1",
    );
    expect_err(Runtime::builder().cache_dir("a\0b").build(), Status::InvalidArgument, "NUL");
}

#[test]
fn memory_round_trips() {
    let rt = emulator();
    let mut buf = rt.alloc(1024).unwrap();
    assert_eq!(buf.len(), 1024);
    assert_eq!(buf.as_ptr() % 256, 0);
    buf.fill_bytes(0xab).unwrap();
    assert!(buf.to_vec::<u8>().unwrap().iter().all(|&x| x == 0xab));
    let h: Vec<u16> = (0..100).map(|i| i * 7 + 1).collect();
    let f: Vec<f32> = (0..50).map(|i| i as f32 * -0.5).collect();
    let n: Vec<i32> = (0..30).map(|i| i - 15).collect();
    buf.upload(&h).unwrap();
    buf.upload_at(256, &f).unwrap();
    buf.upload_at(512, &n).unwrap();
    let mut h2 = vec![0u16; 100];
    let mut f2 = vec![0f32; 50];
    let mut n2 = vec![0i32; 30];
    buf.download(&mut h2).unwrap();
    buf.download_at(256, &mut f2).unwrap();
    buf.download_at(512, &mut n2).unwrap();
    assert_eq!((h, f, n), (h2, f2, n2));
    let bytes = buf.to_vec::<u8>().unwrap();
    assert!(bytes[200..256].iter().all(|&x| x == 0xab), "untouched bytes kept");
    expect_err(
        buf.upload_at(1020, &[0f32; 2]),
        Status::InvalidArgument,
        "exceeds the 1024-byte buffer",
    );
    expect_err(buf.download_at(usize::MAX, &mut [0u8; 2]), Status::InvalidArgument, "flashattn-rs");
    expect_err(rt.alloc(0), Status::InvalidArgument, "fa_malloc: bytes must be > 0");
    let from = rt.alloc_from(&[1i32, 2, 3]).unwrap();
    assert_eq!(from.to_vec::<i32>().unwrap(), vec![1, 2, 3]);
}

#[test]
fn drop_frees_device_memory() {
    let rt = emulator();
    for round in 0..20 {
        let bufs: Vec<_> = (0..100).map(|i| rt.alloc(4096 + i).unwrap()).collect();
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.as_ptr()).collect();
        drop(bufs);
        for p in ptrs {
            // Freeing again must fail: Drop already returned the allocation.
            // SAFETY: fa_free only looks the pointer up.
            let st = unsafe { sys::fa_free(rt.as_raw(), p) };
            assert_eq!(st, sys::FA_ERROR_INVALID_ARGUMENT, "round {round}: {p:#x} still allocated");
        }
    }
    // A buffer keeps its runtime alive after the last Runtime handle is dropped.
    let buf = {
        let rt2 = emulator();
        rt2.alloc_from(&[5u16; 8]).unwrap()
    };
    assert_eq!(buf.to_vec::<u16>().unwrap(), vec![5u16; 8]);
}

#[test]
fn config_accessors_and_errors() {
    let cfg = Config::builder()
        .dtype(Dtype::BF16)
        .head_dim(64)
        .heads(8, 2)
        .causal(true)
        .window(16, -1)
        .softmax_scale(0.1)
        .softcap(30.0)
        .build()
        .unwrap();
    assert_eq!(
        (cfg.dtype(), cfg.head_dim(), cfg.head_dim_v(), cfg.num_heads_q(), cfg.num_heads_kv()),
        (Dtype::BF16, 64, 64, 8, 2)
    );
    expect_err(
        Config::builder().head_dim(32).heads(6, 4).build(),
        Status::InvalidArgument,
        "fa_config_create: num_heads_q (6) must be a multiple of num_heads_kv (4)",
    );
    expect_err(
        Config::builder().head_dim(12).heads(1, 1).build(),
        Status::Unsupported,
        "head_dim must be a multiple of 8 in 8..576, got 12",
    );
    expect_err(
        Config::builder().head_dim(584).heads(16, 1).build(),
        Status::Unsupported,
        "fa_config_create: head_dim must be a multiple of 8 in 8..576, got 584",
    );
    expect_err(
        Config::builder().head_dim(576).head_dim_v(520).heads(16, 1).build(),
        Status::Unsupported,
        "fa_config_create: head_dim_v must be a multiple of 8 in 8..512, got 520",
    );
    expect_err(
        Config::builder().head_dim(32).heads(1, 1).softmax_scale(-1.0).build(),
        Status::InvalidArgument,
        "softmax_scale must be finite",
    );
    expect_err(
        Config::builder().head_dim(32).heads(1, 1).window(-2, -1).build(),
        Status::InvalidArgument,
        "window_left must be >= 0 or -1",
    );
    expect_err(
        Config::builder().head_dim(32).heads(0, 1).build(),
        Status::InvalidArgument,
        "num_heads_q must be >= 1",
    );
}

#[test]
fn generate_writes_ptx() {
    let cfg = small_cfg();
    for (kind, entry) in [
        (KernelKind::Forward, ".entry fa_forward_"),
        (KernelKind::Decode, ".entry fa_decode_"),
        (KernelKind::Reduce, ".entry fa_reduce_"),
        // fa_backward's kernels (g2: the main kernel loops over the group).
        (KernelKind::BackwardPre, ".entry fa_bwdpre_mma_f16_d32_dv32_g1_"),
        (KernelKind::Backward, ".entry fa_backward_mma_f16_d32_dv32_g2_"),
        (KernelKind::BackwardPost, ".entry fa_bwdpost_mma_f16_d32_dv32_g1_"),
    ] {
        let ptx = flashattn::generate(&cfg, kind, 80).unwrap();
        assert!(ptx.contains(entry), "{kind:?}: no {entry}");
        assert!(ptx.contains(".target sm_80"), "{kind:?}");
        assert_eq!(ptx, cfg.generate(kind, 80).unwrap(), "deterministic");
    }
    assert!(cfg.generate(KernelKind::Forward, 90).unwrap().contains(".entry"));
    // The backward takes 16-bit configs only.
    let fp32 = Config::builder().dtype(Dtype::F32).head_dim(32).heads(2, 1).build().unwrap();
    expect_err(
        fp32.generate(KernelKind::Backward, 80),
        Status::Unsupported,
        "dtype FA_DTYPE_FP32 is not supported",
    );
    expect_err(
        cfg.generate(KernelKind::Forward, 75),
        Status::Unsupported,
        "fa_generate: sm must be one of 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, got 75",
    );
    // The C size query / too-small buffer contract, through sys.
    let mut size = 0usize;
    let mut small = [0 as std::ffi::c_char; 10];
    // SAFETY: small holds 10 bytes.
    let st = unsafe {
        sys::fa_generate(
            cfg.as_raw(),
            sys::FA_KERNEL_FORWARD,
            80,
            small.as_mut_ptr(),
            10,
            &mut size,
        )
    };
    assert_eq!(st, sys::FA_ERROR_BUFFER_TOO_SMALL);
    assert_eq!(size, cfg.generate(KernelKind::Forward, 80).unwrap().len());
}

#[test]
fn forward_safe_and_raw_agree() {
    let rt = emulator();
    let cfg = small_cfg();
    let mut b = bufs(&rt, 1);
    b.o.fill_bytes(0xff).unwrap();
    rt.forward(&cfg, fwd(&mut b)).unwrap();
    let n = S * 2 * 32;
    let safe: Vec<u16> = b.o.to_vec::<u16>().unwrap()[..n].to_vec();
    assert!(safe.iter().all(|&h| flashattn::f16_bits_to_f32(h).is_finite()));
    assert!(safe.iter().any(|&h| h != 0));
    b.o.fill_bytes(0xff).unwrap();
    let t = |ptr: u64, shape: [usize; 4]| RawTensor {
        data: ptr,
        strides: flashattn::contiguous_strides(shape),
    };
    let raw = RawForwardArgs {
        batch: 1,
        seqlen_q: S as i32,
        seqlen_k: S as i32,
        q: t(b.q.as_ptr(), QSHAPE),
        k: t(b.k.as_ptr(), KSHAPE),
        v: t(b.v.as_ptr(), KSHAPE),
        o: t(b.o.as_ptr(), QSHAPE),
        ..Default::default()
    };
    // SAFETY: pointers of live buffers holding these extents.
    unsafe { rt.forward_raw(&cfg, &raw, std::ptr::null_mut()) }.unwrap();
    assert_eq!(b.o.to_vec::<u16>().unwrap()[..n], safe[..]);
}

#[test]
fn forward_errors() {
    let rt = emulator();
    let cfg = small_cfg();
    let mut b = bufs(&rt, 2);
    // q stride[3] = 2 (the buffer is large enough for the extent; the library rejects it).
    let big = rt.alloc(4 * S * 2 * 32 * 2).unwrap();
    let mut a = fwd(&mut b);
    a.q = Tensor::new(&big, [0, 2 * 2 * 32 * 2, 2 * 32 * 2, 2]);
    let e = expect_err(
        rt.forward(&cfg, a),
        Status::InvalidArgument,
        "fa_launch: q.stride[3] must be 1, got 2",
    );
    assert_eq!(e.to_string(), "fa_launch: q.stride[3] must be 1, got 2 (invalid argument)");
    let mut a = fwd(&mut b);
    a.k.strides[1] = 12;
    expect_err(
        rt.forward(&cfg, a),
        Status::InvalidArgument,
        "k.stride[1] must be a non-negative multiple of 8",
    );
    let mut a = fwd(&mut b);
    a.batch = 0;
    expect_err(
        rt.forward(&cfg, a),
        Status::InvalidArgument,
        "fa_launch: batch must be >= 1, got 0",
    );
    // Misaligned view: 2 bytes in.
    let mut a = fwd(&mut b);
    a.q = Tensor::contiguous(&big, QSHAPE).at_byte_offset(2);
    expect_err(rt.forward(&cfg, a), Status::InvalidArgument, "q.data 0x");
    // Extent past the buffer is caught before the library is called.
    let mut a = fwd(&mut b);
    a.seqlen_k = 17;
    expect_err(
        rt.forward(&cfg, a),
        Status::InvalidArgument,
        "flashattn-rs: k of shape [1, 17, 1, 32]",
    );
    let mut lse_small = rt.alloc(8).unwrap();
    let mut a = fwd(&mut b);
    a.lse = Some(&mut lse_small);
    expect_err(rt.forward(&cfg, a), Status::InvalidArgument, "flashattn-rs: lse");
    // Memory of another runtime.
    let other = emulator();
    let foreign = other.alloc(2 * S * 2 * 32).unwrap();
    let mut a = fwd(&mut b);
    a.q = Tensor::contiguous(&foreign, QSHAPE);
    expect_err(rt.forward(&cfg, a), Status::InvalidArgument, "another runtime");
    // Null pointer through the raw API.
    let raw = RawForwardArgs { batch: 1, seqlen_q: 1, seqlen_k: 1, ..Default::default() };
    // SAFETY: rejected before any memory access.
    let r = unsafe { rt.forward_raw(&cfg, &raw, std::ptr::null_mut()) };
    expect_err(r, Status::InvalidArgument, "fa_launch: q.data is 0");
    // Errors convert into Box<dyn Error>.
    let boxed: Box<dyn std::error::Error> =
        Box::new(Error { status: Status::Launch, message: "x".into() });
    assert_eq!(boxed.to_string(), "x (kernel launch failed)");
}

#[test]
fn null_handles_through_sys() {
    // SAFETY: the library checks for NULL before use.
    unsafe {
        assert_eq!(
            sys::fa_runtime_create(std::ptr::null(), std::ptr::null_mut()),
            sys::FA_ERROR_INVALID_ARGUMENT
        );
        let msg = std::ffi::CStr::from_ptr(sys::fa_last_error()).to_str().unwrap();
        assert_eq!(msg, "fa_runtime_create: out is NULL");
        let args = sys::fa_forward_args::default();
        assert_eq!(
            sys::fa_launch(std::ptr::null_mut(), std::ptr::null(), &args, std::ptr::null_mut()),
            sys::FA_ERROR_INVALID_ARGUMENT
        );
        let msg = std::ffi::CStr::from_ptr(sys::fa_last_error()).to_str().unwrap();
        assert_eq!(msg, "fa_launch: rt is NULL");
        sys::fa_runtime_destroy(std::ptr::null_mut());
        sys::fa_config_destroy(std::ptr::null_mut());
        assert_eq!(std::ffi::CStr::from_ptr(sys::fa_last_error()).to_bytes(), b"");
    }
}

#[test]
fn decode_and_reduce_errors() {
    let rt = emulator();
    let cfg = small_cfg();
    let b = bufs(&rt, 3);
    let lens = rt.alloc_from(&[4i32]).unwrap();
    let args = |ws, o| DecodeArgs {
        batch: 1,
        seqlen_q: 1,
        seqlen_k_max: S,
        q: Tensor::contiguous(&b.q, [1, 1, 2, 32]),
        k_cache: Tensor::contiguous(&b.k, KSHAPE),
        v_cache: Tensor::contiguous(&b.v, KSHAPE),
        cache_seqlens: &lens,
        num_splits: 0,
        workspace: ws,
        o,
        lse: None,
    };
    expect_err(rt.decode(&cfg, args(None, None)), Status::InvalidArgument, "pass one");
    let mut tiny = rt.alloc(16).unwrap();
    expect_err(
        rt.decode(&cfg, args(Some(&mut tiny), None)),
        Status::InvalidArgument,
        "-byte workspace, got 16",
    );
    let plan = rt
        .decode_workspace_size(
            &cfg,
            &flashattn::RawDecodeArgs {
                batch: 1,
                seqlen_q: 1,
                seqlen_k_max: S as i32,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(plan.workspace_bytes > 0 && plan.num_splits >= 1);
    expect_err(
        rt.decode_workspace_size(&cfg, &Default::default()),
        Status::InvalidArgument,
        "fa_decode_workspace_size: batch must be >= 1, got 0",
    );
    let raw =
        flashattn::RawDecodeArgs { batch: 1, seqlen_q: 1, seqlen_k_max: 4, ..Default::default() };
    // SAFETY: rejected before any memory access.
    let r = unsafe { rt.decode_raw(&cfg, &raw, std::ptr::null_mut()) };
    expect_err(r, Status::InvalidArgument, "fa_decode: q.data is 0");
    let op = rt.alloc(4 * 2 * 64 * 2).unwrap(); // room for stride 2
    let lp = rt.alloc(4 * 2 * 2).unwrap();
    let mut o = rt.alloc(2 * 64).unwrap();
    let r = rt.decode_reduce(
        &cfg,
        ReduceArgs {
            num_splits: 2,
            batch: 1,
            seqlen_q: 1,
            o_partial: View::new(&op, [64, 64, 64, 32, 2]),
            lse_partial: View::contiguous(&lp, [2, 1, 2, 1]),
            o: TensorMut::contiguous(&mut o, [1, 1, 2, 32]),
            lse: None,
        },
    );
    expect_err(
        r,
        Status::InvalidArgument,
        "fa_decode_reduce: o_partial_stride[4] must be 1, got 2",
    );
}

#[test]
fn cache_on_disk_stats_list_clear() {
    let dir = temp_dir("cache");
    let make = || {
        Runtime::builder()
            .backend(Backend::Emulator)
            .cache_mode(CacheMode::Disk)
            .cache_dir(&dir)
            .build()
            .unwrap()
    };
    let cfg = small_cfg();
    {
        let rt = make();
        let mut b = bufs(&rt, 4);
        rt.forward(&cfg, fwd(&mut b)).unwrap();
        rt.forward(&cfg, fwd(&mut b)).unwrap();
        let s = rt.cache_stats().unwrap();
        assert!(s.persistent, "note: {}", s.note);
        assert!(s.path.starts_with(dir.to_str().unwrap()), "{}", s.path);
        assert_eq!(s.misses, 1);
        assert!(s.memory_hits >= 1);
        assert!(s.entries >= 1 && s.bytes > 0);
        // The cold kernel was built under a compile lease; the default cap is on.
        assert_eq!((s.leases, s.lease_waits, s.collisions, s.resets), (1, 0, 0, 0));
        assert!(s.max_bytes > 0);
        // 0.6: the emulator compiles nothing; its note names what cuda would use.
        assert_eq!(s.compiler_mode, flashattn::CompilerMode::None);
        assert_eq!((s.compiler.as_str(), s.cubin_refusals), ("", 0));
        assert!(s.compiler_note.starts_with("the emulator runs the PTX"), "{}", s.compiler_note);
        let list = rt.cache_list().unwrap();
        assert_eq!(list.len() as u64, s.entries);
        for e in &list {
            assert_eq!(e.key.len(), 32);
            assert!(e.key.chars().all(|c| c.is_ascii_hexdigit()));
            assert!(!e.spec.is_empty());
            assert_eq!(e.sm, 80);
            assert!(e.ptx_bytes > 0 && e.created > 0 && e.last_used >= e.created);
            assert_eq!(e.compiler, "");
        }
    }
    let rt = make();
    let mut b = bufs(&rt, 5);
    rt.forward(&cfg, fwd(&mut b)).unwrap();
    let s = rt.cache_stats().unwrap();
    assert_eq!((s.disk_hits, s.misses), (1, 0));
    rt.cache_clear().unwrap();
    assert_eq!(rt.cache_stats().unwrap().entries, 0);
    assert!(rt.cache_list().unwrap().is_empty());
    rt.forward(&cfg, fwd(&mut b)).unwrap(); // loaded kernels stay usable
    drop(b);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    let off = Runtime::builder()
        .backend(Backend::Emulator)
        .cache_mode(CacheMode::Memory)
        .ptx_compiler(flashattn::PtxCompiler::Off)
        .build()
        .unwrap();
    assert_eq!(off.cache_stats().unwrap().compiler_mode, flashattn::CompilerMode::None);
    let mem = emulator().cache_stats().unwrap();
    assert!(!mem.persistent);
    assert_eq!(mem.path, "");
    assert_eq!((mem.max_bytes, mem.leases), (0, 0));
}

#[test]
fn runtime_and_config_shared_by_threads() {
    let rt = emulator();
    let cfg = Arc::new(small_cfg());
    let mut b = bufs(&rt, 6);
    rt.forward(&cfg, fwd(&mut b)).unwrap();
    let want = b.o.to_vec::<u16>().unwrap()[..S * 64].to_vec();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (rt, cfg) = (rt.clone(), cfg.clone());
            std::thread::spawn(move || {
                let mut b = bufs(&rt, 6);
                if t % 2 == 1 {
                    // A failure on this thread must not disturb the others.
                    let mut a = fwd(&mut b);
                    a.batch = 0;
                    assert!(rt.forward(&cfg, a).is_err());
                }
                for _ in 0..3 {
                    b.o.fill_bytes(0xff).unwrap();
                    rt.forward(&cfg, fwd(&mut b)).unwrap();
                }
                b.o.to_vec::<u16>().unwrap()[..S * 64].to_vec()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), want);
    }
}

/// The C handle outlives every use (issue 9, part 3): dropping the last
/// `Runtime` clone while other threads are inside calls through theirs, and
/// then those clones while the threads still hold `DeviceBuffer`s, never
/// destroys it under them: it goes with the last clone or buffer. (Dropping
/// a runtime or config that a call borrows does not compile: see the
/// compile_fail examples on `Runtime`, `DeviceBuffer` and `Config`.)
#[test]
fn runtime_dropped_while_threads_use_clones_and_buffers() {
    let cfg = Arc::new(small_cfg());
    for _round in 0..3 {
        let rt = emulator();
        let start = Arc::new(std::sync::Barrier::new(5));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (rt, cfg, start) = (rt.clone(), cfg.clone(), start.clone());
                std::thread::spawn(move || {
                    let mut b = bufs(&rt, 7);
                    start.wait();
                    for _ in 0..4 {
                        rt.forward(&cfg, fwd(&mut b)).unwrap();
                    }
                    drop(rt); // the buffers keep the runtime alive
                    b.o.fill_bytes(0).unwrap();
                    let o = b.o.to_vec::<u16>().unwrap();
                    assert!(o.iter().all(|&x| x == 0));
                    b.q.to_vec::<u16>().unwrap().len()
                })
            })
            .collect();
        start.wait();
        drop(rt); // while the threads are inside forward
        for h in handles {
            assert_eq!(h.join().unwrap(), S * 2 * 32);
        }
    }
}
