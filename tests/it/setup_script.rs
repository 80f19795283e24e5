//! `scripts/setup.sh` decides whether to install libclang from the library bindgen actually
//! loads. A machine with only `libclang-cpp` (the C++ library) must still get `libclang-dev`.

use std::path::Path;
use std::process::Command;

/// Runs `libclang_in DIR` from the script (sourced with its install step turned off).
fn libclang_in(dir: &Path) -> bool {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup.sh");
    let status = Command::new("bash")
        .arg("-c")
        .arg(r#"COURIER_SETUP_LIB=1; . "$1"; libclang_in "$2""#)
        .arg("bash")
        .arg(&script)
        .arg(dir)
        .status()
        .expect("bash runs");
    status.success()
}

fn dir_with(files: &[&str]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::write(d.path().join(f), b"").unwrap();
    }
    d
}

#[test]
fn libclang_is_found_only_where_bindgen_can_load_it() {
    let cases: &[(&[&str], bool)] = &[
        (&["libclang-cpp.so.14"], false),
        (&["libclang-cpp.so"], false),
        (&["libclang-cpp.so.14", "libclang-cpp.so"], false),
        (&[], false),
        (&["libclangBasic.a"], false),
        (&["libclang.so.1"], true),
        (&["libclang.so"], true),
        (&["libclang-14.so"], true),
        (&["libclang-14.so.1"], true),
        (&["libclang-14.0.6.so.14"], true),
        (&["libclang-cpp.so.14", "libclang.so.1"], true),
    ];
    for (files, want) in cases {
        let d = dir_with(files);
        assert_eq!(libclang_in(d.path()), *want, "{files:?}");
    }
    assert!(!libclang_in(Path::new("/nonexistent/courier-test")));
}

#[test]
fn libclang_path_is_searched_first() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup.sh");
    let d = dir_with(&["libclang.so.1"]);
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"COURIER_SETUP_LIB=1; . "$1"; libclang_dirs | sed -n 1p; have_libclang && echo found"#)
        .arg("bash")
        .arg(&script)
        .env("LIBCLANG_PATH", d.path())
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(d.path().to_str().unwrap()), "{text}");
    assert_eq!(lines.next(), Some("found"), "{text}");
}
