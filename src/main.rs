fn main() -> std::process::ExitCode {
    scdlfs::cli::main()
}
