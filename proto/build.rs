//! Compiles the `.proto` files with a vendored `protoc`, so a fresh clone
//! builds with nothing installed beyond Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // An explicit PROTOC (e.g. the distribution's) wins; otherwise use the vendored one.
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/registry.proto", "proto/context.proto"], &["proto"])?;
    // A2A's gRPC binding (`a2a.proto`, the spec's v1.0.1, verbatim; its
    // google.api imports are vendored in proto/google/api): the router serves
    // it, tests and benches call it.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/a2a.proto"], &["proto"])?;
    // etcd's API: only the client is needed (the registry talks to etcd).
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_protos(&["proto/etcd.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
