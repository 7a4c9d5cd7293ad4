use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::binary::{find_library, is_elf, library_matches, library_rank};
use super::symbols::{strip_generic_arguments, suggestions, Names};
use super::*;
use crate::elf::Function;
use crate::spec::{parse, ProbeSpec};
use crate::testutil::{compile, mapped_file_offset, TempDir};

/// A C program with known functions, an alias, and two USDT probes (one with a
/// semaphore), written as `<sys/sdt.h>` writes them (that header is not installed here).
/// It prints the run-time addresses of its symbols and waits for a line on stdin.
const C_FIXTURE: &str = r#"
#include <stdio.h>
#include <unistd.h>

#define USDT(site, provider, name, semaphore)                              \
  __asm__ __volatile__(                                                    \
      ".globl " site "\n" site ":\n"                                       \
      "990: nop\n"                                                         \
      ".pushsection .note.stapsdt,\"?\",\"note\"\n"                        \
      ".balign 4\n"                                                        \
      ".4byte 992f-991f, 994f-993f, 3\n"                                   \
      "991: .asciz \"stapsdt\"\n"                                          \
      "992: .balign 4\n"                                                   \
      "993: .8byte 990b\n"                                                 \
      ".8byte _.stapsdt.base\n"                                            \
      ".8byte " semaphore "\n"                                             \
      ".asciz \"" provider "\"\n"                                          \
      ".asciz \"" name "\"\n"                                              \
      ".asciz \"-4@%edi\"\n"                                               \
      "994: .balign 4\n"                                                   \
      ".popsection\n"                                                      \
      ".ifndef _.stapsdt.base\n"                                           \
      ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n" \
      ".weak _.stapsdt.base\n"                                             \
      ".hidden _.stapsdt.base\n"                                           \
      "_.stapsdt.base: .space 1\n"                                         \
      ".size _.stapsdt.base, 1\n"                                          \
      ".popsection\n"                                                      \
      ".endif\n")

unsigned short fixture_ready_semaphore __attribute__((section(".probes"), used));
extern char usdt_site_ready[], usdt_site_plain[];

__attribute__((noinline)) int probes_fixture_add(int a, int b) {
  volatile int sum = a;
  sum += b;
  return sum;
}
__attribute__((noinline)) int probes_fixture_sub(int a, int b) {
  __asm__ __volatile__("");
  return a - b;
}
int alias_target(int x) { return x + 1; }
int alias_name(int x) __attribute__((alias("alias_target")));

int main(int argc, char **argv) {
  (void)argv;
  printf("add %lx\n", (unsigned long)&probes_fixture_add);
  printf("ready %lx\n", (unsigned long)usdt_site_ready);
  printf("semaphore %lx\n", (unsigned long)&fixture_ready_semaphore);
  fflush(stdout);
  char c;
  if (read(0, &c, 1) < 0) return 1;
  USDT("usdt_site_ready", "fixture", "ready", "fixture_ready_semaphore");
  USDT("usdt_site_plain", "fixture", "plain", "0");
  return probes_fixture_add(argc, 2) + probes_fixture_sub(argc, 1) + alias_name(argc) > 100;
}
"#;

/// C++ symbols, written in C with their mangled names so that gcc alone builds them:
/// two overloads of `ns::f`, a const method, and `ns::g` with a cold part.
const CPP_FIXTURE: &str = r#"
__attribute__((noipa)) int f_int(int x) __asm__("_ZN2ns1fEi");
__attribute__((noipa)) int f_int(int x) { return x + 1; }
__attribute__((noipa)) int f_double(double x) __asm__("_ZN2ns1fEd");
__attribute__((noipa)) int f_double(double x) { return (int)x; }
__attribute__((noipa)) int method(const void *self) __asm__("_ZNK2ns1K6methodEv");
__attribute__((noipa)) int method(const void *self) { return *(const int *)self; }
__attribute__((noipa)) int g(void) __asm__("_ZN2ns1gEv");
__attribute__((noipa)) int g(void) { return 1; }
__attribute__((noipa)) int g_cold(void) __asm__("_ZN2ns1gEv.cold");
__attribute__((noipa)) int g_cold(void) { return 2; }
int main(int argc, char **argv) {
  (void)argv;
  return f_int(argc) + f_double(1.5) + method(&argc) + g() + g_cold();
}
"#;

const RUST_FIXTURE: &str = r#"
mod cli {
    #[inline(never)]
    pub fn parse(x: u64) -> u64 { std::hint::black_box(x) + 1 }
}
#[inline(never)]
fn generic<T: std::fmt::Display>(t: T) -> usize { std::hint::black_box(t.to_string().len()) }
fn main() { println!("{} {} {}", cli::parse(3), generic(5u32), generic("x")); }
"#;

fn uprobe(spec: &str) -> UprobeSpec {
    match parse(spec).unwrap() {
        ProbeSpec::Uprobe(u) => u,
        other => panic!("{spec} parsed as {other:?}"),
    }
}

fn usdt(spec: &str) -> UsdtSpec {
    match parse(spec).unwrap() {
        ProbeSpec::Usdt(u) => u,
        other => panic!("{spec} parsed as {other:?}"),
    }
}

fn resolve(spec: &str) -> Result<Vec<UprobeTarget>, ResolveError> {
    resolve_uprobe(&uprobe(spec), None)
}

fn resolve_one(spec: &str) -> UprobeTarget {
    let mut targets = resolve(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(targets.len(), 1, "{spec}: {targets:?}");
    targets.pop().unwrap()
}

/// The C fixture running, stopped on its stdin, with the addresses it printed.
struct Running {
    child: Child,
    addresses: BTreeMap<String, u64>,
}

impl Running {
    fn start(binary: &Path) -> Running {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut addresses = BTreeMap::new();
        for _ in 0..3 {
            let line = lines.next().unwrap().unwrap();
            let (name, address) = line.split_once(' ').unwrap();
            addresses.insert(name.to_string(), u64::from_str_radix(address, 16).unwrap());
        }
        Running { child, addresses }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file offset of a printed symbol, as the kernel maps it.
    fn file_offset(&self, name: &str) -> u64 {
        mapped_file_offset(self.pid(), self.addresses[name]).1
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.child.wait();
    }
}

/// Builds the C fixture as a PIE and as a fixed-address executable (whose virtual
/// addresses and file offsets differ by the load address).
fn c_fixtures(dir: &TempDir) -> Vec<PathBuf> {
    vec![
        compile(
            "gcc",
            dir.path(),
            "fixture_pie",
            "c",
            C_FIXTURE,
            &["-O2", "-pie", "-fPIE"],
        ),
        compile(
            "gcc",
            dir.path(),
            "fixture_nopie",
            "c",
            C_FIXTURE,
            &["-O2", "-no-pie"],
        ),
    ]
}

#[test]
fn c_symbols_resolve_to_the_offsets_the_kernel_maps() {
    let dir = TempDir::new("c");
    for binary in c_fixtures(&dir) {
        let running = Running::start(&binary);
        let spec = format!("uprobe:{}:probes_fixture_add", binary.display());
        let target = resolve_one(&spec);
        assert_eq!(target.path, fs::canonicalize(&binary).unwrap());
        assert_eq!(target.symbol, "probes_fixture_add");
        assert_eq!(target.ref_ctr_offset, None);
        assert_eq!(target.file_offset, running.file_offset("add"), "{spec}");

        // The same through the process: no binary named, and by its mappings.
        let targets =
            resolve_uprobe(&uprobe("uprobe:probes_fixture_add"), Some(running.pid())).unwrap();
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].file_offset, target.file_offset);
        assert_eq!(
            fs::metadata(&targets[0].path).unwrap().ino(),
            fs::metadata(&binary).unwrap().ino()
        );

        // An offset into the function, and the function by its address.
        let plus4 = resolve_one(&format!("{spec}+4"));
        assert_eq!(plus4.file_offset, target.file_offset + 4);
        assert_eq!(plus4.symbol, "probes_fixture_add+0x4");
        let by_address = resolve_one(&format!(
            "uprobe:{}:{:#x}",
            binary.display(),
            target.address
        ));
        assert_eq!(by_address.file_offset, target.file_offset);
        assert_eq!(by_address.symbol, "probes_fixture_add");
        let at_4 = resolve_one(&format!(
            "uprobe:{}:{:#x}",
            binary.display(),
            target.address + 4
        ));
        assert_eq!(at_4.symbol, "probes_fixture_add+0x4");
    }
}

/// Where objdump says the instructions of `function` start, as offsets into it.
fn objdump_boundaries(binary: &Path, function: &str) -> Vec<u64> {
    let output = Command::new("objdump")
        .args([
            "-d",
            "--no-show-raw-insn",
            &format!("--disassemble={function}"),
        ])
        .arg(binary)
        .output()
        .expect("objdump runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut addresses = text.lines().filter_map(|line| {
        let (address, _) = line.trim_start().split_once(":\t")?;
        u64::from_str_radix(address, 16).ok()
    });
    let start = addresses.next().expect("objdump lists the function");
    std::iter::once(0)
        .chain(addresses.map(|a| a - start))
        .collect()
}

#[test]
fn offsets_and_addresses_inside_instructions_are_refused_with_the_nearest_boundaries() {
    let dir = TempDir::new("boundaries");
    for binary in c_fixtures(&dir) {
        let name = "probes_fixture_add";
        let start = resolve_one(&format!("uprobe:{}:{name}", binary.display())).address;
        let boundaries = objdump_boundaries(&binary, name);
        assert!(boundaries.len() > 2, "{boundaries:?}");
        let end = *boundaries.last().unwrap();
        for offset in 1..end {
            let by_offset = resolve(&format!("uprobe:{}:{name}+{offset}", binary.display()));
            let by_address = resolve(&format!(
                "uprobe:{}:{:#x}",
                binary.display(),
                start + offset
            ));
            if boundaries.contains(&offset) {
                assert_eq!(by_offset.unwrap()[0].address, start + offset);
                assert_eq!(by_address.unwrap()[0].address, start + offset);
                continue;
            }
            let before = *boundaries.iter().rev().find(|&&b| b < offset).unwrap();
            let after = *boundaries.iter().find(|&&b| b > offset).unwrap();
            let err = by_offset.unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "offset {offset:#x} is inside an instruction of {name} in "
                )),
                "{err}"
            );
            assert!(
                err.ends_with(&format!(
                    "the nearest instruction boundaries are {name}+{before:#x} and {name}+{after:#x}"
                )),
                "{err}"
            );
            let err = by_address.unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "address {:#x} ({name}+{offset:#x}) is inside an instruction",
                    start + offset
                )),
                "{err}"
            );
            assert!(
                err.ends_with(&format!(
                    "boundaries are {:#x} ({name}+{before:#x}) and {:#x} ({name}+{after:#x})",
                    start + before,
                    start + after
                )),
                "{err}"
            );
        }
    }
}

#[test]
fn addresses_in_no_known_function_are_refused_unless_forced() {
    use object::{Object, ObjectSection};
    let dir = TempDir::new("outside");
    let binary = &c_fixtures(&dir)[0];
    let data = fs::read(binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    // The PLT is code without symbols.
    let plt = file.section_by_name(".plt").expect("a .plt").address();
    let spec = uprobe(&format!("uprobe:{}:{plt:#x}", binary.display()));
    let err = resolve_uprobe(&spec, None).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("address {plt:#x} is in no known function of ")),
        "{err}"
    );
    assert!(err.contains("--unsafe"), "{err}");
    let forced = ResolveOptions {
        pid: None,
        unsafe_addresses: true,
    };
    let targets = resolve_uprobe_with(&spec, &forced).unwrap().targets;
    assert_eq!(targets[0].address, plt);
    assert_eq!(targets[0].symbol, format!("{plt:#x}"));
    // Forcing never lets a probe land inside a known instruction.
    let add = resolve_one(&format!("uprobe:{}:probes_fixture_add", binary.display()));
    let spec = uprobe(&format!(
        "uprobe:{}:{:#x}",
        binary.display(),
        add.address + 1
    ));
    let err = resolve_uprobe_with(&spec, &forced).unwrap_err();
    assert!(
        matches!(err, ResolveError::InsideInstruction { .. }),
        "{err}"
    );
}

#[test]
fn usdt_probes_resolve_with_their_semaphores() {
    let dir = TempDir::new("usdt");
    for binary in c_fixtures(&dir) {
        let running = Running::start(&binary);
        let spec = usdt(&format!("usdt:{}:fixture:ready", binary.display()));
        let targets = resolve_usdt(&spec, None).unwrap();
        assert_eq!(targets.len(), 1, "{targets:?}");
        let ready = &targets[0];
        assert_eq!(ready.symbol, "fixture:ready");
        assert_eq!(ready.file_offset, running.file_offset("ready"));
        assert_eq!(ready.ref_ctr_offset, Some(running.file_offset("semaphore")));
        // The probe site is the nop the macro put there.
        let bytes = fs::read(&binary).unwrap();
        assert_eq!(bytes[ready.file_offset as usize], 0x90);

        // Without a provider, by pattern, and without a semaphore.
        let plain = resolve_usdt(&usdt(&format!("usdt:{}:plain", binary.display())), None).unwrap();
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].ref_ctr_offset, None);
        let all =
            resolve_usdt(&usdt(&format!("usdt:{}:fixture:*", binary.display())), None).unwrap();
        assert_eq!(all.len(), 2);
        // Through the process, binary omitted.
        let via_pid = resolve_usdt(&usdt("usdt::fixture:ready"), Some(running.pid())).unwrap();
        assert_eq!(via_pid[0].file_offset, ready.file_offset);

        let err = resolve_usdt(
            &usdt(&format!("usdt:{}:fixture:gone", binary.display())),
            None,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "no USDT probe 'fixture:gone' in {} (it has 2: fixture:plain, fixture:ready)",
                fs::canonicalize(&binary).unwrap().display()
            )
        );
    }
}

#[test]
fn binaries_without_usdt_probes_say_so() {
    let exe = std::env::current_exe().unwrap();
    let err = resolve_usdt(&usdt(&format!("usdt:{}:p:n", exe.display())), None).unwrap_err();
    assert!(
        err.to_string().ends_with("(it has no USDT probes)"),
        "{err}"
    );
}

#[test]
fn patterns_and_aliases() {
    let dir = TempDir::new("patterns");
    let binary = &c_fixtures(&dir)[0];
    let targets = resolve(&format!("uprobe:{}:probes_fixture_*", binary.display())).unwrap();
    let names: Vec<&str> = targets.iter().map(|t| t.symbol.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"probes_fixture_add") && names.contains(&"probes_fixture_sub"));
    // Two names, one address: one probe.
    let aliases = resolve(&format!("uprobe:{}:alias_*", binary.display())).unwrap();
    assert_eq!(aliases.len(), 1, "{aliases:?}");
    let by_alias = resolve_one(&format!("uprobe:{}:alias_name", binary.display()));
    assert_eq!(by_alias.file_offset, aliases[0].file_offset);
}

#[test]
fn missing_symbols_suggest_close_names() {
    let dir = TempDir::new("missing");
    let binary = &c_fixtures(&dir)[0];
    let path = fs::canonicalize(binary).unwrap();
    let err = resolve(&format!("uprobe:{}:probes_fixture_ad", binary.display())).unwrap_err();
    assert!(
        matches!(err, ResolveError::SymbolNotFound { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "no function 'probes_fixture_ad' in {}; did you mean probes_fixture_add",
            path.display()
        )),
        "{message}"
    );
    let err = resolve(&format!("uprobe:{}:zzzzzzzzzzzz", binary.display())).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no function 'zzzzzzzzzzzz' in {}", path.display())
    );
    let err = resolve(&format!("uprobe:{}:nothing_*", binary.display())).unwrap_err();
    assert!(
        err.to_string().starts_with("no function 'nothing_*'"),
        "{err}"
    );
}

#[test]
fn offsets_past_the_function_and_addresses_outside_code_are_refused() {
    let dir = TempDir::new("ranges");
    let binary = &c_fixtures(&dir)[0];
    let err = resolve(&format!(
        "uprobe:{}:probes_fixture_add+0x10000",
        binary.display()
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("offset 0x10000 is past the end of probes_fixture_add ("),
        "{err}"
    );
    let err = resolve(&format!("uprobe:{}:0x10", binary.display())).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("address 0x10 is not in an executable segment of "),
        "{err}"
    );
}

#[test]
fn stripped_binaries_are_named_as_such() {
    let dir = TempDir::new("stripped");
    let stripped = compile(
        "gcc",
        dir.path(),
        "stripped",
        "c",
        C_FIXTURE,
        &["-O2", "-s"],
    );
    let err = resolve(&format!("uprobe:{}:probes_fixture_add", stripped.display())).unwrap_err();
    assert!(matches!(err, ResolveError::Stripped { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(
            ": the binary is stripped (no .symtab) and 'probes_fixture_add' is not among its"
        ),
        "{message}"
    );
    // Exported functions stay in .dynsym, and are found there.
    let exported = compile(
        "gcc",
        dir.path(),
        "exported",
        "c",
        C_FIXTURE,
        &["-O2", "-s", "-rdynamic"],
    );
    let target = resolve_one(&format!("uprobe:{}:probes_fixture_add", exported.display()));
    assert_eq!(target.symbol, "probes_fixture_add");
}

#[test]
fn files_that_are_missing_or_not_elf() {
    let dir = TempDir::new("files");
    let err = resolve("uprobe:./no/such/prog:main").unwrap_err();
    assert_eq!(err.to_string(), "no such file: ./no/such/prog");
    let script = dir.path().join("script.sh");
    fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let err = resolve(&format!("uprobe:{}:main", script.display())).unwrap_err();
    assert!(matches!(err, ResolveError::NotElf { .. }), "{err:?}");
    assert!(err.to_string().ends_with("is not an ELF file"), "{err}");
    let err = resolve("uprobe:libprobes_no_such_library:f").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("library 'libprobes_no_such_library' not found in "),
        "{err}"
    );
    assert!(err.to_string().ends_with("; give its path"), "{err}");
    let err = resolve("uprobe:probes-no-such-program:main").unwrap_err();
    assert_eq!(
        err.to_string(),
        "'probes-no-such-program' is neither a file in the current directory nor a program \
         on PATH; give its path"
    );
    let err = resolve("uprobe:malloc").unwrap_err();
    assert_eq!(
        err.to_string(),
        "'uprobe:malloc' names no binary; write it as uprobe:PATH:SYMBOL, or attach to a \
         process with -p PID"
    );
}

#[test]
fn programs_on_path() {
    // `sh` is on PATH everywhere; it may or may not be stripped, but it is an ELF file.
    let path = resolve_binary("sh", None).unwrap();
    assert!(path.is_absolute(), "{}", path.display());
    assert!(is_elf(&path));
}

#[test]
fn library_names() {
    for (query, file, expected) in [
        ("libc", "libc.so.6", true),
        ("libc", "libc.so", true),
        ("libc", "libc-2.31.so", true),
        ("libc", "libcrypto.so.3", false),
        ("libc", "libc-client.so.2007e", false),
        ("libc.so.6", "libc.so.6", true),
        ("libc.so", "libc.so.6", true),
        ("libc.so.6", "libc.so.60", false),
        ("libpthread", "libpthread.so.0", true),
        ("libpthread", "libpthread-2.31.so", true),
        ("libstdc++", "libstdc++.so.6", true),
        ("libstdc++", "libstdc++.so.6.0.33", true),
    ] {
        assert_eq!(library_matches(query, file), expected, "{query} vs {file}");
    }
    let rank = |f| library_rank("libc", f);
    assert!(rank("libc.so.6") < rank("libc-2.31.so"));
    assert!(rank("libc-2.31.so") < rank("libc.so"));
    assert!(library_rank("libc.so.6", "libc.so.6") < rank("libc.so.6"));
}

#[test]
fn libc_by_short_name_and_by_process() {
    let by_name = resolve_binary("libc", None).unwrap();
    let name = by_name.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("libc.so") || name.starts_with("libc-"),
        "{name}"
    );
    assert!(is_elf(&by_name));
    // This test process maps libc: the mapping wins, and it is the same file.
    let by_pid = resolve_binary("libc", Some(std::process::id())).unwrap();
    assert_eq!(
        fs::metadata(&by_pid).unwrap().ino(),
        fs::metadata(&by_name).unwrap().ino()
    );
    let full = resolve_binary("libc.so.6", Some(std::process::id())).unwrap();
    assert_eq!(full, by_pid);

    let malloc = resolve_uprobe(&uprobe("uprobe:libc:malloc"), Some(std::process::id())).unwrap();
    assert_eq!(malloc.len(), 1);
    assert_eq!(malloc[0].symbol, "malloc");
    // Where this process has malloc mapped is where the probe goes.
    let (file, offset) = mapped_file_offset(
        std::process::id(),
        libc::malloc as *const () as usize as u64,
    );
    assert_eq!(
        fs::metadata(&file).unwrap().ino(),
        fs::metadata(&by_pid).unwrap().ino()
    );
    assert_eq!(malloc[0].file_offset, offset);

    let retprobe = resolve_uprobe(&uprobe("uretprobe:libc:free"), None).unwrap();
    assert_eq!(retprobe[0].symbol, "free");
}

#[test]
fn default_symbol_versions_win() {
    // glibc has realpath@GLIBC_2.2.5 and the default realpath@@GLIBC_2.3 at another
    // address; a bare name means the default one, as the dynamic linker binds it.
    let libc_path = resolve_binary("libc", None).unwrap();
    let info = ElfInfo::load(&libc_path).unwrap();
    let versions: Vec<&Function> = info
        .functions
        .iter()
        .filter(|f| f.name == "realpath")
        .collect();
    let target = resolve_one("uprobe:libc:realpath");
    if versions.len() > 1 {
        let default = versions.iter().find(|f| !f.hidden_version).unwrap();
        assert_eq!(target.address, default.address);
    } else {
        eprintln!("this libc has one realpath version; only checked that it resolves");
    }
}

#[test]
fn stripped_libraries_suggest_exported_names() {
    let err = resolve("uprobe:libc:mallocc").unwrap_err();
    let message = err.to_string();
    assert!(message.contains("'mallocc'"), "{message}");
    assert!(message.contains("did you mean malloc"), "{message}");
}

#[test]
fn functions_merged_into_libc_are_pointed_to() {
    // On glibc >= 2.34 libpthread.so.0 is a stub; older ones still define the function.
    match resolve("uprobe:libpthread:pthread_create") {
        Ok(targets) => eprintln!(
            "SKIP: this libpthread still defines pthread_create ({})",
            targets[0].path.display()
        ),
        Err(ResolveError::LibraryNotFound { .. }) => {
            eprintln!("SKIP: this system has no libpthread")
        }
        Err(e) => assert_eq!(
            e.to_string(),
            "no function 'pthread_create' in libpthread, but libc has it (glibc 2.34 merged \
             libpthread, libdl and librt into libc); use uprobe:libc:pthread_create"
        ),
    }
}

#[inline(never)]
pub(crate) fn resolve_test_target(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3)
}

#[test]
fn rust_paths_in_this_test_binary() {
    assert_eq!(resolve_test_target(std::hint::black_box(2)), 6);
    let exe = std::env::current_exe().unwrap();
    let spec = format!(
        "uprobe:{}:probes::resolve::tests::resolve_test_target",
        exe.display()
    );
    let target = resolve_one(&spec);
    assert_eq!(target.symbol, "probes::resolve::tests::resolve_test_target");
    let runtime = resolve_test_target as fn(u64) -> u64 as usize as u64;
    let (file, offset) = mapped_file_offset(std::process::id(), runtime);
    assert_eq!(
        fs::metadata(&file).unwrap().ino(),
        fs::metadata(&exe).unwrap().ino()
    );
    assert_eq!(target.file_offset, offset);

    // The same function by its mangled name.
    let info = ElfInfo::load(&exe).unwrap();
    let mangled = info
        .functions
        .iter()
        .find(|f| f.address == target.address && f.name.starts_with("_ZN"))
        .map(|f| f.name.clone())
        .expect("legacy-mangled symbol");
    let by_mangled = resolve_one(&format!("uprobe:{}:{mangled}", exe.display()));
    assert_eq!(by_mangled.file_offset, target.file_offset);

    // The right name in the wrong module is suggested.
    let err = resolve(&format!(
        "uprobe:{}:elsewhere::resolve_test_target",
        exe.display()
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("did you mean probes::resolve::tests::resolve_test_target"),
        "{err}"
    );
}

#[test]
fn rust_v0_and_legacy_mangling() {
    let dir = TempDir::new("rust");
    // Legacy is rustc's default for user crates (and needs no flag, which would be
    // unstable); v0 is opt-in.
    for (mangling, flags) in [
        ("v0", &["-C", "symbol-mangling-version=v0"][..]),
        ("legacy", &[][..]),
    ] {
        let mut args = vec!["-O", "--crate-name", "fixture"];
        args.extend_from_slice(flags);
        let binary = compile(
            "rustc",
            dir.path(),
            &format!("fixture_{mangling}"),
            "rs",
            RUST_FIXTURE,
            &args,
        );
        let target = resolve_one(&format!("uprobe:{}:fixture::cli::parse", binary.display()));
        assert_eq!(target.symbol, "fixture::cli::parse", "{mangling}");

        // Two instantiations of one generic function: ambiguous, listed, then picked.
        let err = resolve(&format!("uprobe:{}:fixture::generic", binary.display())).unwrap_err();
        let ResolveError::AmbiguousSymbol {
            count, candidates, ..
        } = &err
        else {
            panic!("{mangling}: {err:?}");
        };
        assert_eq!(*count, 2, "{err}");
        assert!(
            err.to_string()
                .contains("or 'fixture::generic*' to probe them all"),
            "{err}"
        );
        let mangled = candidates[0]
            .split(" (")
            .nth(1)
            .unwrap()
            .split(')')
            .next()
            .unwrap();
        resolve_one(&format!("uprobe:{}:{mangled}", binary.display()));
        let all = resolve(&format!("uprobe:{}:fixture::generic*", binary.display())).unwrap();
        assert_eq!(all.len(), 2, "{mangling}");
        if mangling == "v0" {
            // v0 names carry their generic arguments, which select one.
            let one = resolve_one(&format!(
                "uprobe:{}:fixture::generic::<u32>",
                binary.display()
            ));
            assert_eq!(one.symbol, "fixture::generic::<u32>");
        }
    }
}

#[test]
fn cpp_names_with_and_without_arguments() {
    let dir = TempDir::new("cpp");
    let binary = compile("gcc", dir.path(), "fixture", "c", CPP_FIXTURE, &["-O2"]);
    let path = binary.display();
    let one = resolve_one(&format!("uprobe:{path}:ns::f(int)"));
    assert_eq!(one.symbol, "ns::f(int)");
    assert_eq!(
        resolve_one(&format!("uprobe:{path}:_ZN2ns1fEi")).file_offset,
        one.file_offset
    );
    assert_eq!(
        resolve_one(&format!("uprobe:{path}:ns::K::method")).symbol,
        "ns::K::method() const"
    );
    resolve_one(&format!("uprobe:{path}:ns::K::method() const"));
    // Spacing in argument lists does not matter.
    resolve_one(&format!("uprobe:{path}:ns::f( int )"));

    // Overloads: ambiguous, unless the spec says C++, which probes them all (bpftrace).
    let err = resolve(&format!("uprobe:{path}:ns::f")).unwrap_err();
    assert!(
        matches!(err, ResolveError::AmbiguousSymbol { count: 2, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("ns::f(int) (_ZN2ns1fEi) at 0x"),
        "{err}"
    );
    let all = resolve(&format!("uprobe:{path}:cpp:ns::f")).unwrap();
    assert_eq!(all.len(), 2);

    // A cold part is no entry point: `ns::g` is the function, not its `.cold` half.
    let g = resolve_one(&format!("uprobe:{path}:ns::g"));
    assert_eq!(g.symbol, "ns::g()");
}

#[test]
fn generic_arguments_are_stripped_from_the_end_only() {
    assert_eq!(
        strip_generic_arguments("f::generic::<u32>"),
        Some("f::generic")
    );
    assert_eq!(
        strip_generic_arguments("f::g::<alloc::vec::Vec<u8>>"),
        Some("f::g")
    );
    assert_eq!(strip_generic_arguments("f::g::<fn() -> u8>"), Some("f::g"));
    assert_eq!(strip_generic_arguments("f::g"), None);
    assert_eq!(strip_generic_arguments("<T as f::Tr>"), None);
}

#[test]
fn suggestions_rank_same_suffix_first() {
    let names: Vec<Names> = [
        "a::parse",
        "b::parse_all",
        "parsec",
        "unrelated",
        "c::prase",
    ]
    .iter()
    .map(|n| Names::of(n))
    .collect();
    let found = suggestions("x::parse", &names);
    assert_eq!(found[0], "a::parse");
    assert!(found.contains(&"c::prase".to_string()), "{found:?}");
    assert!(!found.contains(&"unrelated".to_string()), "{found:?}");
}

/// Whether this machine has libc's separate debug file (libc6-dbg, which CI installs).
fn libc_debug_file() -> bool {
    let libc = find_library("libc", None).unwrap();
    let found = unwind_tables::find_debug_file_path(&libc, &unwind_tables::DebugSearch::default())
        .is_some();
    if !found {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI has no debug file for {}: .ci/setup.sh installs libc6-dbg",
            libc.display()
        );
        eprintln!("skipping: no debug file for {} (libc6-dbg)", libc.display());
    }
    found
}

#[test]
fn ifunc_symbols_resolve_to_the_implementation_this_process_calls() {
    let pid = std::process::id();
    // Taking a function's address goes through the GOT, which ld.so filled with what
    // the IFUNC's resolver returned: the implementation this process calls.
    let called: [(&str, usize); 2] = [
        ("strlen", libc::strlen as *const () as usize),
        ("memcpy", libc::memcpy as *const () as usize),
    ];
    for (name, address) in called {
        let (path, file_offset) = mapped_file_offset(pid, address as u64);
        let spec = uprobe(&format!("uprobe:libc:{name}"));
        let options = ResolveOptions {
            pid: Some(pid),
            unsafe_addresses: false,
        };
        let resolution = resolve_uprobe_with(&spec, &options).unwrap();
        assert_eq!(resolution.targets.len(), 1, "{resolution:?}");
        let target = &resolution.targets[0];
        assert_eq!(
            fs::metadata(&target.path).unwrap().ino(),
            fs::metadata(&path).unwrap().ino()
        );
        assert_eq!(target.file_offset, file_offset, "{name}: {resolution:?}");
        let [Notice::Ifunc {
            implementations,
            selected_in,
            ..
        }] = resolution.notices.as_slice()
        else {
            panic!("{name}: {resolution:?}");
        };
        assert_eq!(*selected_in, Some(pid));
        assert_eq!(implementations, std::slice::from_ref(&target.symbol));
        let line = resolution.notices[0].to_string();
        assert!(
            line.starts_with(&format!("{name} in ")) && line.contains(" is an IFUNC: probing "),
            "{line}"
        );

        // Without a process: every implementation the resolver can select, that one
        // among them.
        let all = resolve_uprobe(&spec, None).unwrap();
        assert!(all.len() > 1, "{name}: {all:?}");
        assert!(
            all.iter().any(|t| t.file_offset == file_offset),
            "{name}: {all:?}"
        );
        if libc_debug_file() {
            assert!(
                all.iter().all(|t| t.symbol.starts_with("__")),
                "implementations are named: {all:?}"
            );
        }
    }
}

#[test]
fn names_from_the_separate_debug_file_are_probes() {
    if !libc_debug_file() {
        return;
    }
    let getppid = resolve_one("uprobe:libc:getppid");
    let internal = resolve_one("uprobe:libc:__GI_getppid");
    assert_eq!(internal.address, getppid.address);
    // A static function only the debug file names, and a pattern over such names.
    let evex = resolve_one("uprobe:libc:__strlen_evex");
    assert_eq!(evex.symbol, "__strlen_evex");
    let all = resolve("uprobe:libc:__strlen_*").unwrap();
    assert!(all.len() > 2, "{all:?}");
    assert!(all.iter().any(|t| t.address == evex.address), "{all:?}");
}

#[test]
fn a_pattern_probes_ifuncs_at_their_implementations_in_one_notice() {
    if !libc_debug_file() {
        return;
    }
    let pid = std::process::id();
    let options = ResolveOptions {
        pid: Some(pid),
        unsafe_addresses: false,
    };
    let resolution = resolve_uprobe_with(&uprobe("uprobe:libc:str*len*"), &options).unwrap();
    let strlen = resolve_uprobe_with(&uprobe("uprobe:libc:strlen"), &options).unwrap();
    // strlen's resolver has aliases (glibc's `strlen_ifunc`): none of them is probed.
    let libc = ElfInfo::load(&find_library("libc", None).unwrap()).unwrap();
    let resolver = libc.functions.iter().find(|f| f.name == "strlen").unwrap();
    assert!(
        !resolution
            .targets
            .iter()
            .any(|t| t.address == resolver.address),
        "{resolution:?}"
    );
    assert!(resolution
        .targets
        .iter()
        .any(|t| t.address == strlen.targets[0].address));
    let [notice] = resolution.notices.as_slice() else {
        panic!("{resolution:?}");
    };
    let line = notice.to_string();
    assert!(line.contains("functions matching 'str*len*' in "), "{line}");
    assert!(
        line.contains(&format!("strlen -> {}", strlen.targets[0].symbol)),
        "{line}"
    );
}

/// Functions whose first instruction Linux's uprobes misread (VEX 0x74, vpcmpeqb, read
/// as `je`): one whose second instruction can stand for its entry, one whose second
/// instruction is a loop's head.
const AVX_FIXTURE: &str = r#"
__asm__(".text\n"
        ".globl avx_first\n.type avx_first, @function\navx_first:\n"
        "vpcmpeqb %xmm0, %xmm0, %xmm1\n"
        "xor %eax, %eax\n"
        "vmovd %xmm1, %eax\n"
        "ret\n.size avx_first, .-avx_first\n"
        ".globl avx_loop\n.type avx_loop, @function\navx_loop:\n"
        "vpcmpeqb %xmm0, %xmm0, %xmm1\n"
        "1: dec %edi\n"
        "jnz 1b\n"
        "ret\n.size avx_loop, .-avx_loop\n");
int main(void) { return 0; }
"#;

#[test]
fn instructions_the_kernel_would_skip_are_never_probed() {
    let dir = TempDir::new("avx");
    let binary = compile("gcc", dir.path(), "avx", "c", AVX_FIXTURE, &["-O2"]);
    let path = binary.display();
    let libc_free = |spec: &str| resolve_uprobe_with(&uprobe(spec), &ResolveOptions::default());
    let entry = {
        let info = ElfInfo::load(&binary).unwrap();
        info.functions
            .iter()
            .find(|f| f.name == "avx_first")
            .unwrap()
            .address
    };

    // The entry moves past the instruction, and says so.
    let moved = libc_free(&format!("uprobe:{path}:avx_first")).unwrap();
    assert_eq!(moved.targets.len(), 1);
    assert_eq!(moved.targets[0].address, entry + 4);
    assert_eq!(moved.targets[0].symbol, "avx_first+0x4");
    let [Notice::PastHazard {
        kind: HazardKind::Misread,
        moved: list,
        ..
    }] = moved.notices.as_slice()
    else {
        panic!("{moved:?}");
    };
    assert_eq!(
        list,
        &[("avx_first".to_string(), "vpcmpeqb".to_string(), 4)]
    );

    // Asked for by offset or address: refused, naming the next instruction.
    let err = libc_free(&format!("uprobe:{path}:{entry:#x}")).unwrap_err();
    assert!(
        matches!(&err, ResolveError::Hazard { instruction, next, .. }
            if instruction == "vpcmpeqb" && *next == format!("{:#x}", entry + 4)),
        "{err}"
    );
    let at_second = libc_free(&format!("uprobe:{path}:avx_first+4")).unwrap();
    assert_eq!(at_second.targets[0].address, entry + 4);
    assert!(at_second.notices.is_empty());

    // A loop's head is no entry: refused alone, left out of a pattern.
    let err = libc_free(&format!("uprobe:{path}:avx_loop")).unwrap_err();
    assert!(err.to_string().contains("is a branch target"), "{err}");
    let pattern = libc_free(&format!("uprobe:{path}:avx_*")).unwrap();
    assert_eq!(pattern.targets.len(), 1, "{pattern:?}");
    assert!(
        pattern.notices.iter().any(
            |n| matches!(n, Notice::SkippedHazard { functions, .. } if functions == &["avx_loop"])
        ),
        "{pattern:?}"
    );
}

/// Functions starting with a 5-byte nop, which Linux 6.18's uprobes turn into a call
/// that crashes forked children: one whose second instruction can stand for its entry,
/// one whose second instruction is a loop's head, one with a 5-byte nop further in
/// (`66 0f 1f 40 00`, after a 3-byte move), one starting with a misread AVX instruction
/// (for a pattern over both kinds), and a USDT site on a 5-byte nop.
const NOP5_FIXTURE: &str = r#"
__asm__(".text\n"
        ".globl nop5_first\n.type nop5_first, @function\nnop5_first:\n"
        ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
        "mov %rdi, %rax\n"
        "ret\n.size nop5_first, .-nop5_first\n"
        ".globl nop5_loop\n.type nop5_loop, @function\nnop5_loop:\n"
        ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
        "1: dec %edi\n"
        "jnz 1b\n"
        "ret\n.size nop5_loop, .-nop5_loop\n"
        ".globl nop5_inside\n.type nop5_inside, @function\nnop5_inside:\n"
        "mov %rdi, %rax\n"
        ".byte 0x66, 0x0f, 0x1f, 0x40, 0x00\n"
        "ret\n.size nop5_inside, .-nop5_inside\n"
        ".globl avx_first\n.type avx_first, @function\navx_first:\n"
        "vpcmpeqb %xmm0, %xmm0, %xmm1\n"
        "xor %eax, %eax\n"
        "ret\n.size avx_first, .-avx_first\n"
        ".globl usdt_nop5\n.type usdt_nop5, @function\nusdt_nop5:\n"
        "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
        ".pushsection .note.stapsdt,\"?\",\"note\"\n"
        ".balign 4\n"
        ".4byte 992f-991f, 994f-993f, 3\n"
        "991: .asciz \"stapsdt\"\n"
        "992: .balign 4\n"
        "993: .8byte 990b\n"
        ".8byte _.stapsdt.base\n"
        ".8byte 0\n"
        ".asciz \"fixture\"\n"
        ".asciz \"nop5\"\n"
        ".asciz \"\"\n"
        "994: .balign 4\n"
        ".popsection\n"
        ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"
        ".weak _.stapsdt.base\n.hidden _.stapsdt.base\n"
        "_.stapsdt.base: .space 1\n.size _.stapsdt.base, 1\n"
        ".popsection\n"
        "ret\n.size usdt_nop5, .-usdt_nop5\n");
int main(void) { return 0; }
"#;

#[test]
fn five_byte_nops_the_kernel_would_turn_into_calls_are_never_probed() {
    let dir = TempDir::new("nop5");
    let binary = compile("gcc", dir.path(), "nop5", "c", NOP5_FIXTURE, &["-O2"]);
    let path = binary.display();
    let resolve = |spec: &str| resolve_uprobe_with(&uprobe(spec), &ResolveOptions::default());
    let info = ElfInfo::load(&binary).unwrap();
    let address = |name: &str| {
        info.functions
            .iter()
            .find(|f| f.name == name)
            .unwrap()
            .address
    };
    let entry = address("nop5_first");

    // The entry moves past the nop, for a return probe too (its breakpoint is at the
    // entry), and one line says so.
    for probe in ["uprobe", "uretprobe"] {
        let moved = resolve(&format!("{probe}:{path}:nop5_first")).unwrap();
        assert_eq!(moved.targets.len(), 1);
        assert_eq!(moved.targets[0].address, entry + 5, "{probe}");
        assert_eq!(moved.targets[0].symbol, "nop5_first+0x5");
        let [notice @ Notice::PastHazard {
            kind: HazardKind::OptimizedNop,
            moved: list,
            ..
        }] = moved.notices.as_slice()
        else {
            panic!("{moved:?}");
        };
        let nop = "nop (0f 1f 44 00 00)".to_string();
        assert_eq!(list, &[("nop5_first".to_string(), nop, 5)]);
        let line = notice.to_string();
        assert!(
            line.starts_with("nop5_first in ")
                && line.contains("starts with nop (0f 1f 44 00 00), a 5-byte nop")
                && line.contains("a child it forks does not inherit")
                && line.ends_with(
                    "probing its next instruction, nop5_first+0x5, reached once per call"
                ),
            "{line}"
        );
    }

    // By address, or by offset further in: refused, naming the next instruction.
    let err = resolve(&format!("uprobe:{path}:{entry:#x}")).unwrap_err();
    assert!(
        matches!(&err, ResolveError::Hazard { kind: HazardKind::OptimizedNop, next, .. }
            if *next == format!("{:#x}", entry + 5)),
        "{err}"
    );
    let line = err.to_string();
    assert!(
        line.starts_with(&format!(
            "address {entry:#x} (nop5_first) in {path} is nop (0f 1f 44 00 00), a 5-byte nop"
        )) && line.ends_with(&format!("probe the next instruction, at {:#x}", entry + 5)),
        "{line}"
    );
    let err = resolve(&format!("uprobe:{path}:nop5_inside+3")).unwrap_err();
    assert!(
        matches!(&err, ResolveError::Hazard { instruction, next, .. }
            if instruction == "nop (66 0f 1f 40 00)" && next == "nop5_inside+0x8"),
        "{err}"
    );
    let past = resolve(&format!("uprobe:{path}:nop5_first+5")).unwrap();
    assert_eq!(past.targets[0].address, entry + 5);
    assert!(past.notices.is_empty());

    // A loop's head is no entry: refused alone, left out of a pattern.
    let err = resolve(&format!("uprobe:{path}:nop5_loop")).unwrap_err();
    assert!(
        matches!(
            err,
            ResolveError::HazardEntry {
                kind: HazardKind::OptimizedNop,
                ..
            }
        ) && err.to_string().contains("is a branch target"),
        "{err}"
    );
    let pattern = resolve(&format!("uprobe:{path}:nop5_*")).unwrap();
    let probed: Vec<&str> = pattern.targets.iter().map(|t| t.symbol.as_str()).collect();
    assert_eq!(probed, ["nop5_first+0x5", "nop5_inside"], "{pattern:?}");
    assert!(
        pattern.notices.iter().any(|n| matches!(n,
            Notice::SkippedHazard { kind: HazardKind::OptimizedNop, functions, .. }
                if functions == &["nop5_loop"])),
        "{pattern:?}"
    );

    // Hazards of both kinds in one pattern: one line for each.
    let both = resolve(&format!("uprobe:{path}:*_first")).unwrap();
    let kinds: Vec<HazardKind> = both
        .notices
        .iter()
        .filter_map(|n| match n {
            Notice::PastHazard { kind, moved, .. } if moved.len() == 1 => Some(*kind),
            _ => None,
        })
        .collect();
    assert_eq!(kinds.len(), 2, "{both:?}");
    assert!(kinds.contains(&HazardKind::Misread) && kinds.contains(&HazardKind::OptimizedNop));

    // A USDT site on one: refused, naming the next instruction.
    let site = address("usdt_nop5");
    let err = resolve_usdt(&usdt(&format!("usdt:{path}:fixture:nop5")), None).unwrap_err();
    assert!(
        matches!(&err, ResolveError::Hazard { location, kind: HazardKind::OptimizedNop, next, .. }
            if *location == format!("USDT probe fixture:nop5 at {site:#x}")
                && *next == format!("{:#x}", site + 5)),
        "{err}"
    );
}

/// Functions written in assembly, each with the symbol size a compiler gives it:
/// `direct` starts `cmp $0x1000,%rdi; ja`, as jemalloc's malloc does; `rejoined` starts
/// the same, and its `.cold` part jumps back to its `ja`; `shifted` moves its arguments
/// up a register before a tail call, as the mimalloc crate's `mi_malloc_aligned` does;
/// `entered` starts as `direct` does, but another function jumps to its `ja`;
/// `switched` jumps where a register says (a jump table's target is unknown).
const COLD_FIXTURE: &str = r#"
__asm__(
    ".text\n"
    ".globl direct\n.type direct,@function\n"
    "direct:\n cmp $0x1000,%rdi\n ja 1f\n xor %eax,%eax\n ret\n1: mov $1,%eax\n ret\n"
    ".size direct,.-direct\n"
    ".globl rejoined\n.type rejoined,@function\n"
    "rejoined:\n cmp $0x1000,%rdi\n2: ja rejoined.cold\n xor %eax,%eax\n ret\n"
    ".size rejoined,.-rejoined\n"
    ".globl rejoined.cold\n.type rejoined.cold,@function\n"
    "rejoined.cold:\n sub $0x1000,%rdi\n cmp $0x1000,%rdi\n jmp 2b\n"
    ".size rejoined.cold,.-rejoined.cold\n"
    ".globl shifted\n.type shifted,@function\n"
    "shifted:\n mov %rsi,%rdx\n mov %rdi,%rsi\n xor %edi,%edi\n jmp direct\n"
    ".size shifted,.-shifted\n"
    ".globl entered\n.type entered,@function\n"
    "entered:\n cmp $0x1000,%rdi\n3: ja 1f\n xor %eax,%eax\n ret\n1: mov $1,%eax\n ret\n"
    ".size entered,.-entered\n"
    ".globl enters\n.type enters,@function\n"
    "enters:\n mov $0x2000,%edi\n jmp 3b\n"
    ".size enters,.-enters\n"
    ".globl switched\n.type switched,@function\n"
    "switched:\n cmp $0x1000,%rdi\n ja 1f\n xor %eax,%eax\n ret\n1: jmp *%rdi\n"
    ".size switched,.-switched\n");
int direct(unsigned long);
int rejoined(unsigned long);
int main(int argc, char **argv) { return direct(argc) + rejoined(argc); }
"#;

#[test]
fn entries_move_to_the_first_emulated_instruction_unless_something_else_jumps_there() {
    let dir = TempDir::new("cold");
    let path = compile("gcc", dir.path(), "cold", "c", COLD_FIXTURE, &["-O1"]);
    let info = ElfInfo::load(&path).unwrap();
    let address = |name: &str| {
        info.functions
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .address
    };
    let names = ["direct", "rejoined", "shifted", "entered", "switched"];
    let entries: Vec<u64> = names.iter().map(|name| address(name)).collect();
    let moved = cheaper_entries(&path, &entries).unwrap();
    let offsets: Vec<u64> = moved
        .iter()
        .zip(&entries)
        .map(|(entry, start)| entry.address - start)
        .collect();
    // `cmp $0x1000,%rdi` is 7 bytes: the probe moves to the `ja` after it, which the
    // kernel emulates, unless something jumps there (the `.cold` part, another
    // function) or may (a computed jump). `shifted`'s three moves are 3, 3 and 2 bytes.
    assert_eq!(offsets, vec![7, 0, 8, 0, 0]);
    assert_eq!(moved[0].holds, [0, 1, 2, 3, 4, 5].map(Some));
    let shifted = [None, Some(0), Some(1), Some(3), Some(4), Some(5)];
    assert_eq!(moved[2].holds, shifted);
}
