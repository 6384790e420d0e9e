//! Finds libflashattn and tells cargo how to link it.
//!
//! Search order: $FLASHATTN_LIB_DIR (directory holding libflashattn.so), then
//! `pkg-config --libs-only-L flashattn`, then the linker's default paths.
//! The header directory ($FLASHATTN_INCLUDE_DIR, pkg-config --cflags-only-I,
//! or LIB_DIR/../include) is passed to the layout test.
//! Exported to dependents (links = "flashattn"): DEP_FLASHATTN_LIB_DIR,
//! DEP_FLASHATTN_INCLUDE.
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// Runs pkg-config with `flag` and returns the values of the tokens that
/// start with `prefix` (e.g. "-L"), or nothing if pkg-config fails.
fn pkg_config(flag: &str, prefix: &str) -> Vec<String> {
    let pc = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    match Command::new(pc).args([flag, "flashattn"]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|t| t.strip_prefix(prefix).map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

fn main() {
    for var in ["FLASHATTN_LIB_DIR", "FLASHATTN_INCLUDE_DIR", "PKG_CONFIG_PATH", "PKG_CONFIG"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let lib_dirs: Vec<String> = match env::var("FLASHATTN_LIB_DIR") {
        Ok(d) if !d.is_empty() => vec![d],
        _ => pkg_config("--libs-only-L", "-L"),
    };
    if lib_dirs.is_empty() {
        println!(
            "cargo:warning=flashattn-sys: neither FLASHATTN_LIB_DIR nor pkg-config found \
             libflashattn; relying on the linker's default search path"
        );
    }
    for d in &lib_dirs {
        println!("cargo:rustc-link-search=native={d}");
        // Lets this crate's own tests find the shared library at run time.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{d}");
    }
    println!("cargo:rustc-link-lib=dylib=flashattn");
    if let Some(d) = lib_dirs.first() {
        println!("cargo:lib_dir={d}");
    }

    let include = match env::var("FLASHATTN_INCLUDE_DIR") {
        Ok(d) if !d.is_empty() => Some(d),
        _ => pkg_config("--cflags-only-I", "-I").into_iter().next().or_else(|| {
            lib_dirs.first().map(|d| {
                let mut p = PathBuf::from(d);
                p.pop();
                p.push("include");
                p.to_string_lossy().into_owned()
            })
        }),
    };
    // pkg-config omits system include dirs (-I/usr/include): fall back there.
    let include = include.unwrap_or_else(|| "/usr/include".to_string());
    println!("cargo:include={include}");
    println!("cargo:rustc-env=FLASHATTN_SYS_INCLUDE_DIR={include}");
}
