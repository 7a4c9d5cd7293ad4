//! Builders for small synthetic ELF files with hand-written CFI, so each rule shape the
//! compiler recognizes (and each it must refuse) is tested on exactly the bytes that
//! produce it.

#![allow(dead_code)]

/// DWARF register numbers.
pub const RBP: u8 = 6;
pub const RSP: u8 = 7;
pub const R10: u8 = 10;
pub const RA: u8 = 16;

pub fn uleb(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

pub fn sleb(mut value: i64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        let done = (value == 0 && byte & 0x40 == 0) || (value == -1 && byte & 0x40 != 0);
        out.push(if done { byte } else { byte | 0x80 });
        if done {
            return;
        }
    }
}

/// Call frame instructions, appended to a byte vector.
#[derive(Default, Clone)]
pub struct Cfa(pub Vec<u8>);

impl Cfa {
    pub fn new() -> Self {
        Cfa(Vec::new())
    }
    pub fn def_cfa(mut self, reg: u8, offset: u64) -> Self {
        self.0.push(0x0c);
        uleb(reg.into(), &mut self.0);
        uleb(offset, &mut self.0);
        self
    }
    pub fn def_cfa_offset(mut self, offset: u64) -> Self {
        self.0.push(0x0e);
        uleb(offset, &mut self.0);
        self
    }
    pub fn def_cfa_register(mut self, reg: u8) -> Self {
        self.0.push(0x0d);
        uleb(reg.into(), &mut self.0);
        self
    }
    pub fn def_cfa_expression(mut self, expr: &[u8]) -> Self {
        self.0.push(0x0f);
        uleb(expr.len() as u64, &mut self.0);
        self.0.extend_from_slice(expr);
        self
    }
    /// reg saved at CFA + factored * -8 (the CIE's data alignment).
    pub fn offset(mut self, reg: u8, factored: u64) -> Self {
        self.0.push(0x80 | reg);
        uleb(factored, &mut self.0);
        self
    }
    pub fn expression(mut self, reg: u8, expr: &[u8]) -> Self {
        self.0.push(0x10);
        uleb(reg.into(), &mut self.0);
        uleb(expr.len() as u64, &mut self.0);
        self.0.extend_from_slice(expr);
        self
    }
    pub fn val_offset(mut self, reg: u8, factored: u64) -> Self {
        self.0.push(0x14);
        uleb(reg.into(), &mut self.0);
        uleb(factored, &mut self.0);
        self
    }
    pub fn register(mut self, reg: u8, in_reg: u8) -> Self {
        self.0.push(0x09);
        uleb(reg.into(), &mut self.0);
        uleb(in_reg.into(), &mut self.0);
        self
    }
    pub fn undefined(mut self, reg: u8) -> Self {
        self.0.push(0x07);
        uleb(reg.into(), &mut self.0);
        self
    }
    pub fn same_value(mut self, reg: u8) -> Self {
        self.0.push(0x08);
        uleb(reg.into(), &mut self.0);
        self
    }
    pub fn advance(mut self, delta: u8) -> Self {
        assert!(delta < 64);
        self.0.push(0x40 | delta);
        self
    }
    pub fn remember(mut self) -> Self {
        self.0.push(0x0a);
        self
    }
    pub fn restore_state(mut self) -> Self {
        self.0.push(0x0b);
        self
    }
    pub fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
}

/// DWARF expression operations.
pub mod op {
    use super::{sleb, uleb};

    pub fn breg(reg: u8, offset: i64) -> Vec<u8> {
        let mut out = vec![0x70 + reg];
        sleb(offset, &mut out);
        out
    }
    pub const DEREF: u8 = 0x06;
    pub const AND: u8 = 0x1a;
    pub const GE: u8 = 0x2a;
    pub const SHL: u8 = 0x24;
    pub const PLUS: u8 = 0x22;
    pub fn lit(n: u8) -> u8 {
        0x30 + n
    }
    pub fn plus_uconst(value: u64) -> Vec<u8> {
        let mut out = vec![0x23];
        uleb(value, &mut out);
        out
    }
    pub fn consts(value: i64) -> Vec<u8> {
        let mut out = vec![0x11];
        sleb(value, &mut out);
        out
    }

    /// GCC's PLT CFA expression with `threshold` (11 or 10 in real binaries).
    pub fn plt(threshold: u8) -> Vec<u8> {
        let mut out = breg(7, 8);
        out.extend(breg(16, 0));
        out.extend([lit(15), AND, lit(threshold), GE, lit(3), SHL, PLUS]);
        out
    }
}

/// The CIE instructions every x86-64 compiler emits: CFA = rsp + 8, RA at CFA - 8.
pub fn standard_cie() -> Cfa {
    Cfa::new().def_cfa(RSP, 8).offset(RA, 1)
}

/// An `.eh_frame` section with absolute (udata8) FDE addresses.
#[derive(Default)]
pub struct EhFrame {
    pub bytes: Vec<u8>,
}

impl EhFrame {
    pub fn new() -> Self {
        Self::default()
    }

    fn pad(entry: &mut Vec<u8>) {
        // Length field (4) + entry must be a multiple of 8: pad with DW_CFA_nop.
        while !(entry.len() + 4).is_multiple_of(8) {
            entry.push(0);
        }
    }

    /// Appends a CIE; returns its offset. `augmentation` is "zR" or "zRS" (signal frame).
    pub fn cie(&mut self, augmentation: &str, instructions: &Cfa) -> usize {
        let offset = self.bytes.len();
        let mut entry = vec![0, 0, 0, 0, 1]; // CIE id 0, version 1
        entry.extend_from_slice(augmentation.as_bytes());
        entry.push(0);
        uleb(1, &mut entry); // code alignment
        sleb(-8, &mut entry); // data alignment
        entry.push(RA); // return address register (u8 in version 1)
        uleb(1, &mut entry); // augmentation data length
        entry.push(0x04); // FDE pointers: DW_EH_PE_udata8, absolute
        entry.extend_from_slice(&instructions.0);
        Self::pad(&mut entry);
        self.bytes
            .extend_from_slice(&(entry.len() as u32).to_le_bytes());
        self.bytes.extend(entry);
        offset
    }

    pub fn fde(&mut self, cie: usize, start: u64, len: u64, instructions: &Cfa) {
        let pointer_field = self.bytes.len() + 4;
        let mut entry = Vec::new();
        entry.extend_from_slice(&((pointer_field - cie) as u32).to_le_bytes());
        entry.extend_from_slice(&start.to_le_bytes());
        entry.extend_from_slice(&len.to_le_bytes());
        uleb(0, &mut entry); // augmentation data length
        entry.extend_from_slice(&instructions.0);
        Self::pad(&mut entry);
        self.bytes
            .extend_from_slice(&(entry.len() as u32).to_le_bytes());
        self.bytes.extend(entry);
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.extend_from_slice(&[0, 0, 0, 0]);
        self.bytes
    }
}

/// A `.debug_frame` section (DWARF 4 CIEs, absolute 8-byte addresses).
#[derive(Default)]
pub struct DebugFrame {
    pub bytes: Vec<u8>,
}

impl DebugFrame {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cie(&mut self, instructions: &Cfa) -> usize {
        let offset = self.bytes.len();
        let mut entry = vec![0xff, 0xff, 0xff, 0xff, 4, 0]; // CIE id, version 4, ""
        entry.push(8); // address size
        entry.push(0); // segment selector size
        uleb(1, &mut entry);
        sleb(-8, &mut entry);
        uleb(RA.into(), &mut entry);
        entry.extend_from_slice(&instructions.0);
        EhFrame::pad(&mut entry);
        self.bytes
            .extend_from_slice(&(entry.len() as u32).to_le_bytes());
        self.bytes.extend(entry);
        offset
    }

    pub fn fde(&mut self, cie: usize, start: u64, len: u64, instructions: &Cfa) {
        let mut entry = Vec::new();
        entry.extend_from_slice(&(cie as u32).to_le_bytes());
        entry.extend_from_slice(&start.to_le_bytes());
        entry.extend_from_slice(&len.to_le_bytes());
        entry.extend_from_slice(&instructions.0);
        EhFrame::pad(&mut entry);
        self.bytes
            .extend_from_slice(&(entry.len() as u32).to_le_bytes());
        self.bytes.extend(entry);
    }

    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

const SHT_PROGBITS: u32 = 1;
const SHT_STRTAB: u32 = 3;
const SHT_NOTE: u32 = 7;
const SHT_NOBITS: u32 = 8;
const SHF_ALLOC: u64 = 2;
const SHF_EXECINSTR: u64 = 4;
const SHF_COMPRESSED: u64 = 0x800;

struct Section {
    name: String,
    kind: u32,
    flags: u64,
    addr: u64,
    size: u64,
    data: Vec<u8>,
}

/// A minimal x86-64 ELF: one executable PT_LOAD covering `code`, and the given sections.
pub struct Elf {
    pub machine: u16,
    pub code: (u64, u64),
    sections: Vec<Section>,
}

impl Elf {
    /// Code at `[start, start + len)`.
    pub fn new(start: u64, len: u64) -> Self {
        Elf {
            machine: 62,
            code: (start, len),
            sections: vec![Section {
                name: ".text".into(),
                kind: SHT_NOBITS,
                flags: SHF_ALLOC | SHF_EXECINSTR,
                addr: start,
                size: len,
                data: Vec::new(),
            }],
        }
    }

    pub fn section(mut self, name: &str, addr: u64, data: Vec<u8>) -> Self {
        self.sections.push(Section {
            name: name.into(),
            kind: SHT_PROGBITS,
            flags: if name == ".eh_frame" { SHF_ALLOC } else { 0 },
            addr,
            size: data.len() as u64,
            data,
        });
        self
    }

    /// A SHF_COMPRESSED section: an Elf64_Chdr of `ch_type` claiming `claimed_size`
    /// uncompressed bytes, then `stream`.
    pub fn compressed_section(
        mut self,
        name: &str,
        ch_type: u32,
        claimed_size: u64,
        stream: &[u8],
    ) -> Self {
        let mut data = Vec::new();
        data.extend_from_slice(&ch_type.to_le_bytes());
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&claimed_size.to_le_bytes());
        data.extend_from_slice(&1u64.to_le_bytes());
        data.extend_from_slice(stream);
        self.sections.push(Section {
            name: name.into(),
            kind: SHT_PROGBITS,
            flags: SHF_COMPRESSED,
            addr: 0,
            size: data.len() as u64,
            data,
        });
        self
    }

    pub fn eh_frame(self, data: Vec<u8>) -> Self {
        self.section(".eh_frame", 0x9_0000, data)
    }

    pub fn debug_frame(self, data: Vec<u8>) -> Self {
        self.section(".debug_frame", 0, data)
    }

    pub fn build_id(mut self, id: &[u8]) -> Self {
        let mut note = Vec::new();
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&(id.len() as u32).to_le_bytes());
        note.extend_from_slice(&3u32.to_le_bytes()); // NT_GNU_BUILD_ID
        note.extend_from_slice(b"GNU\0");
        note.extend_from_slice(id);
        while !note.len().is_multiple_of(4) {
            note.push(0);
        }
        self.sections.push(Section {
            name: ".note.gnu.build-id".into(),
            kind: SHT_NOTE,
            flags: SHF_ALLOC,
            addr: 0,
            size: note.len() as u64,
            data: note,
        });
        self
    }

    pub fn debuglink(self, name: &str, crc: u32) -> Self {
        let mut data = name.as_bytes().to_vec();
        data.push(0);
        while !data.len().is_multiple_of(4) {
            data.push(0);
        }
        data.extend_from_slice(&crc.to_le_bytes());
        self.section(".gnu_debuglink", 0, data)
    }

    pub fn build(self) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_offsets = Vec::new();
        for section in &self.sections {
            name_offsets.push(names.len() as u32);
            names.extend_from_slice(section.name.as_bytes());
            names.push(0);
        }
        let shstrtab_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");

        let phoff = 64u64;
        let mut out = vec![0u8; 64 + 56];
        // Section data after the headers, 8-aligned.
        let mut data_offsets = Vec::new();
        for section in &self.sections {
            while !out.len().is_multiple_of(8) {
                out.push(0);
            }
            data_offsets.push(out.len() as u64);
            out.extend_from_slice(&section.data);
        }
        let names_offset = out.len() as u64;
        out.extend_from_slice(&names);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let shoff = out.len() as u64;
        let shnum = self.sections.len() as u16 + 2;

        // ELF header.
        out[..16].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        out[18..20].copy_from_slice(&self.machine.to_le_bytes());
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[24..32].copy_from_slice(&self.code.0.to_le_bytes()); // e_entry
        out[32..40].copy_from_slice(&phoff.to_le_bytes());
        out[40..48].copy_from_slice(&shoff.to_le_bytes());
        out[52..54].copy_from_slice(&64u16.to_le_bytes());
        out[54..56].copy_from_slice(&56u16.to_le_bytes());
        out[56..58].copy_from_slice(&1u16.to_le_bytes());
        out[58..60].copy_from_slice(&64u16.to_le_bytes());
        out[60..62].copy_from_slice(&shnum.to_le_bytes());
        out[62..64].copy_from_slice(&(shnum - 1).to_le_bytes());
        // PT_LOAD, R+X, covering the code (no file bytes: the code itself is not needed).
        let ph = &mut out[64..120];
        ph[0..4].copy_from_slice(&1u32.to_le_bytes());
        ph[4..8].copy_from_slice(&5u32.to_le_bytes());
        ph[16..24].copy_from_slice(&self.code.0.to_le_bytes());
        ph[24..32].copy_from_slice(&self.code.0.to_le_bytes());
        ph[40..48].copy_from_slice(&self.code.1.to_le_bytes());
        ph[48..56].copy_from_slice(&0x1000u64.to_le_bytes());

        let mut header = |name: u32, kind: u32, flags: u64, addr: u64, offset: u64, size: u64| {
            let mut sh = [0u8; 64];
            sh[0..4].copy_from_slice(&name.to_le_bytes());
            sh[4..8].copy_from_slice(&kind.to_le_bytes());
            sh[8..16].copy_from_slice(&flags.to_le_bytes());
            sh[16..24].copy_from_slice(&addr.to_le_bytes());
            sh[24..32].copy_from_slice(&offset.to_le_bytes());
            sh[32..40].copy_from_slice(&size.to_le_bytes());
            sh[48..56].copy_from_slice(&(if kind == SHT_NOTE { 4u64 } else { 1u64 }).to_le_bytes());
            out.extend_from_slice(&sh);
        };
        header(0, 0, 0, 0, 0, 0);
        for (index, section) in self.sections.iter().enumerate() {
            header(
                name_offsets[index],
                section.kind,
                section.flags,
                section.addr,
                data_offsets[index],
                section.size,
            );
        }
        header(
            shstrtab_name,
            SHT_STRTAB,
            0,
            0,
            names_offset,
            names.len() as u64,
        );
        out
    }
}

/// An ELF with code at 0x1000..0x3000 and the given .eh_frame.
pub fn elf_with_eh_frame(eh_frame: EhFrame) -> Vec<u8> {
    Elf::new(0x1000, 0x2000).eh_frame(eh_frame.finish()).build()
}

/// A zlib stream holding `data` in stored (uncompressed) deflate blocks: valid input for
/// any zlib decoder, without needing a compressor in the tests.
pub fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![&[][..]]
    } else {
        data.chunks(0xffff).collect()
    };
    for (index, chunk) in chunks.iter().enumerate() {
        out.push(u8::from(index + 1 == chunks.len()));
        let len = chunk.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    out.extend_from_slice(&((b << 16) | a).to_be_bytes());
    out
}
