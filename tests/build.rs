//! Generates pprof's message types for [`pprof`](src/pprof.rs) from the published schema
//! (the copy in profile/proto), with prost; protox parses it, so no `protoc`.

fn main() {
    const PROTO: &str = "../profile/proto/profile.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors =
        protox::compile([PROTO], ["../profile/proto"]).expect("parsing profile.proto");
    prost_build::Config::new()
        .compile_fds(descriptors)
        .expect("generating the pprof types");
}
