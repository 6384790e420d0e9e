//! cache_warm (fa_cache_warm, since 0.7): a cache warmed with no GPU for
//! sm_80 and sm_90 serves an emulator runtime at that SM with no kernel built
//! (the forward and a split decode checked against the f64 reference); bad
//! input is the library's error naming the line and key; progress is called
//! once per kernel, and a panic in it resumes after the call.
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{decode_case, forward_case, temp_dir, Problem};
use flashattn::{
    cache_warm, cache_warm_preset, cache_warm_presets, cache_warm_with_progress, parse_sms,
    Backend, CacheMode, CacheStats, Runtime, Status, WarmOptions,
};

/// The kernels `run` launches: the forward, the decode and its combine.
const SPECS: &str = "# fp16, head_dim 64, 2 heads\n\
    forward dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2\n\
    decode  dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2\n\
    reduce  dtype=fp16 head_dim=64\n";

/// A fresh scratch cache directory, mode 0700.
fn scratch(tag: &str) -> PathBuf {
    let d = temp_dir(tag);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn opts(sms: &[i32], dir: &Path) -> WarmOptions {
    WarmOptions {
        sms: sms.to_vec(),
        specs: Some(SPECS.into()),
        cache_dir: Some(dir.into()),
        jobs: 2,
        ptx_only: true,
        ..Default::default()
    }
}

/// A causal forward and a 2-split decode (fp16, head_dim 64, 2 heads, fresh
/// inputs, f64-checked) on an emulator runtime at `sm` over `dir` (None:
/// memory only); its cache counters after them.
fn run(sm: i32, dir: Option<&Path>, seed: u64) -> CacheStats {
    let mut b = Runtime::builder().backend(Backend::Emulator).emulator_sm(sm);
    b = match dir {
        Some(d) => b.cache_mode(CacheMode::Disk).cache_dir(d),
        None => b.cache_mode(CacheMode::Memory),
    };
    let rt = b.build().unwrap();
    let p = Problem {
        batch: 2,
        seqlen_q: 24,
        seqlen_k: 24,
        hq: 2,
        hkv: 2,
        d: 64,
        dv: 64,
        causal: true,
        scale: 1.0 / 8.0,
    };
    forward_case(&rt, p, seed);
    let dec = Problem { seqlen_q: 1, seqlen_k: 160, ..p };
    let plan = decode_case(&rt, dec, &[130, 77], 2, seed + 1);
    assert_eq!(plan.num_splits, 2);
    rt.cache_stats().unwrap()
}

#[test]
fn warm_then_run_builds_nothing() {
    let dir = scratch("warm");
    let mut calls = Vec::new();
    let c = cache_warm_with_progress(&opts(&[80, 90], &dir), |p| {
        calls.push((p.counts.clone(), p.spec.to_string(), p.sm))
    })
    .unwrap();
    assert_eq!((c.total, c.done, c.built, c.present, c.failed, c.skipped), (6, 6, 6, 0, 0, 0));
    assert!(c.bytes > 0 && c.seconds >= 0.0);
    assert_eq!(c.compiler, ""); // PTX rows
                                // Progress: once per kernel, in order, consistent counts.
    assert_eq!(calls.len() as u64, c.total);
    for (i, (p, spec, sm)) in calls.iter().enumerate() {
        assert_eq!((p.done, p.total), (i as u64 + 1, 6));
        assert_eq!(p.built + p.present + p.failed, p.done);
        assert!(*sm == 80 || *sm == 90, "sm {sm}");
        assert!(!spec.is_empty());
    }
    assert_eq!(calls.iter().filter(|x| x.2 == 90).count(), 3);
    assert_eq!((calls[5].0.built, calls[5].0.bytes), (c.built, c.bytes));
    for sm in [80, 90] {
        let s = run(sm, Some(&dir), sm as u64);
        assert!(s.persistent && s.path.starts_with(dir.to_str().unwrap()), "{s:?}");
        assert_eq!((s.misses, s.compiles, s.disk_hits), (0, 0, 3), "sm_{sm}: {s:?}");
        let control = run(sm, None, sm as u64 + 7); // the same calls build their kernels
        assert_eq!(control.misses, 3);
    }
    // Again: every row present; sm_120's rows are added beside.
    let again =
        cache_warm(&WarmOptions { sms: parse_sms("80,90a,120f").unwrap(), ..opts(&[], &dir) })
            .unwrap();
    assert_eq!((again.total, again.present, again.built), (9, 6, 3));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn parse_sms_takes_the_cli_forms() {
    assert_eq!(parse_sms("sm_100a,90a,120f,89,86").unwrap(), vec![100, 90, 120, 89, 86]);
    for bad in ["", "80,", "9x", "sm_", "a", "80,+90", "12345"] {
        let e = parse_sms(bad).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{bad}");
        assert!(e.message.contains("is not an SM"), "{bad}: {e}");
    }
}

#[test]
fn presets() {
    let presets = cache_warm_presets();
    assert!(presets.len() >= 9);
    for name in ["llama-3-8b", "gpt-oss", "deepseek-v3"] {
        assert!(presets.iter().any(|(n, _)| n == name), "{name}");
    }
    for (name, description) in &presets {
        assert!(!description.is_empty());
        let text = cache_warm_preset(name).unwrap();
        assert!(text.starts_with(&format!("# {name}:")), "{text}");
        for kind in ["\nforward ", "\ndecode ", "\nreduce "] {
            assert!(text.contains(kind), "{name} lacks{kind}");
        }
    }
    let e = cache_warm_preset("llama-9").unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(
        e.message.contains("unknown preset 'llama-9'") && e.message.contains("gpt-oss:"),
        "{e}"
    );
    // gpt-oss on sm_80 and sm_86: its e4m3 KV decodes need sm_89 (skipped).
    let fp8_lines = cache_warm_preset("gpt-oss").unwrap().matches("kv_dtype=0,e4m3").count();
    let dir = scratch("preset");
    let c = cache_warm(&WarmOptions {
        sms: vec![80, 86],
        presets: vec!["gpt-oss".into()],
        cache_dir: Some(dir.clone()),
        ptx_only: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(fp8_lines, 2);
    assert_eq!(c.skipped, 2 * fp8_lines as u64);
    assert!(c.total > 0 && c.built == c.total && c.failed == 0, "{c:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_names_the_line_and_key() {
    let dir = scratch("bad");
    let with_specs = |specs: &str| WarmOptions { specs: Some(specs.into()), ..opts(&[80], &dir) };
    let cases: Vec<(WarmOptions, Status, Vec<&str>)> = vec![
        (opts(&[], &dir), Status::InvalidArgument, vec!["sms must name at least one SM"]),
        (opts(&[80, 75], &dir), Status::Unsupported, vec!["sms[1]", "got 75"]),
        (
            WarmOptions { specs: None, ..opts(&[80], &dir) },
            Status::InvalidArgument,
            vec!["neither presets nor specs"],
        ),
        (
            WarmOptions {
                presets: vec!["llama-3-8b,llama-9".into()],
                specs: None,
                ..opts(&[80], &dir)
            },
            Status::InvalidArgument,
            vec!["unknown preset 'llama-9'", "gpt-oss:"],
        ),
        (
            with_specs("forward dtype=fp16 head_dim=64\ndecode dtype=fp16 heads=2"),
            Status::InvalidArgument,
            vec!["specs line 2", "unknown key 'heads'"],
        ),
        (
            with_specs("forward dtype=fp15 head_dim=64"),
            Status::InvalidArgument,
            vec!["specs line 1", "'fp15' is not a value of dtype"],
        ),
        (
            with_specs("\nreduce dtype=fp16 head_dim=64 varlen=1"),
            Status::InvalidArgument,
            vec!["specs line 2", "varlen"],
        ),
        (
            with_specs("forward dtype=fp16\0 head_dim=64"),
            Status::InvalidArgument,
            vec!["specs contains a NUL byte"],
        ),
        (WarmOptions { jobs: 1 << 31, ..opts(&[80], &dir) }, Status::InvalidArgument, vec!["jobs"]),
    ];
    for (o, status, words) in cases {
        let e = cache_warm(&o).unwrap_err();
        assert_eq!(e.status, status, "{o:?}: {e}");
        for w in words {
            assert!(e.message.contains(w), "{o:?}: '{e}' lacks '{w}'");
        }
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written");
    // A directory others may write is not a cache to run code from.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = cache_warm(&opts(&[80], &dir)).unwrap_err();
    assert_eq!(e.status, Status::Cache, "{e}");
    assert!(e.message.contains("cannot be written"), "{e}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_panic_in_progress_resumes_after_the_call() {
    let dir = scratch("panic");
    let mut calls = 0;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cache_warm_with_progress(&opts(&[80, 89], &dir), |_| {
            calls += 1;
            if calls == 2 {
                panic!("from progress");
            }
        })
    }));
    let payload = outcome.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"from progress"));
    assert_eq!(calls, 2, "not called again once it panicked");
    // The call itself ran to the end: every kernel was written.
    let c = cache_warm(&opts(&[80, 89], &dir)).unwrap();
    assert_eq!((c.total, c.present, c.built), (6, 6, 0));
    let _ = std::fs::remove_dir_all(&dir);
}
