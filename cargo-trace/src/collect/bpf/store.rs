//! The BPF maps as a [`TableStore`]: where the walker in the kernel finds the tables
//! and each process's mappings.

use bpf_prog::{FileMapping, Loss, Mapping, TableId, Tracer};
use unwind_tables::CompactTable;

use crate::frame::ObjectId;
use crate::limits::Limit;
use crate::tables::{FileKey, Registered, StoreError, StoreId, TableRef, TableStore};

// The session keeps no more mappings per process than the walker holds.
const _: () = assert!(bpf_prog::MAX_MAPPINGS == crate::tables::MAX_MAPPINGS);
const _: () = assert!(bpf_prog::ObjectId::MAX == ObjectId::MAX);

/// The tracer with the tables it was given, by the session's handles.
pub struct KernelTables<'a> {
    pub tracer: &'a mut Tracer,
    /// `TableRef(i)` is `tables[i]`.
    pub tables: &'a mut Vec<TableId>,
}

impl TableStore for KernelTables<'_> {
    fn store_id(&self) -> StoreId {
        StoreId::Kernel
    }

    fn add_table(&mut self, table: &std::sync::Arc<CompactTable>) -> Result<TableRef, StoreError> {
        match self.tracer.add_table(table) {
            Ok(id) => {
                self.tables.push(id);
                Ok(TableRef(self.tables.len() as u32 - 1))
            }
            Err(bpf_prog::Error::MapFull { map, needed, free }) => {
                let limit = Limit::Table(map);
                Err(StoreError::Full {
                    limit,
                    message: format!(
                        "the kernel's unwind-table {map} map is full: this table needs \
                         {needed} entries, {free} are free (raise {})",
                        limit.raised_by().join(" or ")
                    ),
                })
            }
            Err(other) => Err(StoreError::Other(other.into())),
        }
    }

    fn set_mappings(&mut self, pid: u32, mappings: &[Registered]) -> Result<(), StoreError> {
        let mappings: Vec<Mapping> = mappings.iter().map(|m| self.mapping(m)).collect();
        self.tracer
            .set_mappings(pid, &mappings)
            .map_err(|error| match error.is_map_full() {
                true => StoreError::Full {
                    limit: Limit::Loss(Loss::ProcsFull),
                    message: format!("{:#}", anyhow::Error::new(error)),
                },
                false => StoreError::Other(error.into()),
            })
    }

    fn add_file_mapping(&mut self, file: FileKey, mapping: &Registered) -> anyhow::Result<bool> {
        let file = FileMapping {
            dev: file.dev,
            inode: file.inode,
            offset: file.offset,
        };
        Ok(self.tracer.add_file_mapping(file, &self.mapping(mapping))?)
    }
}

impl KernelTables<'_> {
    fn mapping(&self, registered: &Registered) -> Mapping {
        Mapping {
            start: registered.start,
            end: registered.end,
            bias: registered.bias,
            table: registered
                .table
                .and_then(|TableRef(index)| self.tables.get(index as usize).copied()),
            object: registered
                .object
                .and_then(|id| bpf_prog::ObjectId::new(id.index())),
        }
    }
}
