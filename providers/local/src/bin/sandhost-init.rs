//! PID 1 of a local sandbox (see `sandhost_provider_local::init`).
fn main() {
    sandhost_provider_local::init::main()
}
