//! pprof files as a client reads them: gunzip, decode `perftools.profiles.Profile`.

use std::io::Read;
use std::path::Path;

use prost::Message;

/// The types of pprof's `profile.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// Reads and decodes the gzipped pprof file at `path`.
pub fn read(path: &Path) -> proto::Profile {
    let gz = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&*gz)
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| panic!("{} is not gzipped: {e}", path.display()));
    proto::Profile::decode(&*bytes)
        .unwrap_or_else(|e| panic!("{} is not a profile.proto: {e}", path.display()))
}

/// The string at `index` of the profile's string table.
pub fn text(profile: &proto::Profile, index: i64) -> &str {
    &profile.string_table[usize::try_from(index).expect("a string index")]
}
