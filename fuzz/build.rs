//! Links the C++ standard library, which a prebuilt RocksDB (`ROCKSDB_LIB_DIR`, see
//! docs/security.md) needs and which librocksdb-sys only adds when it compiles RocksDB itself.
fn main() {
    if std::env::var_os("ROCKSDB_LIB_DIR").is_some() {
        println!("cargo:rustc-link-lib=stdc++");
    }
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
}
