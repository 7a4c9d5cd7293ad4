//! Generates the pprof message types from `proto/profile.proto` (pprof's published
//! schema) with prost; protox parses the schema, so no `protoc` is needed.

fn main() {
    const PROTO: &str = "proto/profile.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"]).expect("parsing proto/profile.proto");
    prost_build::Config::new()
        .compile_fds(descriptors)
        .expect("generating the pprof types");
}
