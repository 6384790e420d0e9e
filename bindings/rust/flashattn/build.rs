//! Gives this crate's tests, examples and binaries an rpath to the directory
//! flashattn-sys linked libflashattn from (DEP_FLASHATTN_LIB_DIR), so they run
//! without LD_LIBRARY_PATH. Link arguments of a dependency's build script do
//! not reach dependents, hence this script.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FLASHATTN_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_FLASHATTN_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
