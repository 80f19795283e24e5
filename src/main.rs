//! The `courier` binary: everything lives in the library; see `courier --help`.

fn main() -> std::process::ExitCode {
    courier::cli::main()
}
