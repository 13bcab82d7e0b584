//! The local provider's worker: JSON-RPC over stdin/stdout (see
//! `sandhost_provider_local::worker`).
fn main() {
    sandhost_provider_local::worker::main()
}
