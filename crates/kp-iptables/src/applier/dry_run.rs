//! `--dry-run`: write what would be programmed instead of programming it.

use std::fmt;
use std::io::Write;

use kp_model::IpFamily;

use super::{Applier, ApplyError, SavedTable};
use crate::jumps::{JumpRule, Table};

/// Writes, per sync, the commands that would create chains and insert jump
/// rules (as `#` comment lines, so the output stays valid restore input)
/// followed by the exact `iptables-restore` input, under a
/// `# IPv4 iptables-restore input` header. Reports no existing chains and
/// every canary as present, so it never asks for extra work.
///
/// The restore input is held back until [`Applier::end_sync`], so the
/// commands come first whatever order the backend runs them in.
pub struct DryRunApplier {
    out: Box<dyn Write + Send>,
    pending_restore: String,
}

impl DryRunApplier {
    /// A dry run writing to `out` (stdout in the binary).
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            pending_restore: String::new(),
        }
    }

    fn comment(
        &mut self,
        family: IpFamily,
        table: Table,
        args: fmt::Arguments<'_>,
    ) -> Result<(), ApplyError> {
        let command = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        writeln!(self.out, "# {command} -t {table} {args}").map_err(ApplyError::Write)
    }
}

impl fmt::Debug for DryRunApplier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DryRunApplier").finish_non_exhaustive()
    }
}

impl Applier for DryRunApplier {
    fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), ApplyError> {
        let (label, command) = match family {
            IpFamily::V4 => ("IPv4", "iptables"),
            IpFamily::V6 => ("IPv6", "ip6tables"),
        };
        self.pending_restore.push_str(&format!(
            "# {label} {command}-restore input (--noflush --counters)\n"
        ));
        self.pending_restore.push_str(text);
        Ok(())
    }

    fn end_sync(&mut self) -> Result<(), ApplyError> {
        let text = std::mem::take(&mut self.pending_restore);
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(ApplyError::Write)
    }

    fn save_table(&mut self, _family: IpFamily, _table: Table) -> Result<SavedTable, ApplyError> {
        Ok(SavedTable::default())
    }

    fn chain_exists(
        &mut self,
        _family: IpFamily,
        _table: Table,
        _chain: &str,
    ) -> Result<bool, ApplyError> {
        Ok(true)
    }

    fn ensure_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<(), ApplyError> {
        self.comment(family, table, format_args!("-N {chain}"))
    }

    fn delete_jump(&mut self, family: IpFamily, rule: &JumpRule) -> Result<bool, ApplyError> {
        let line = rule.restore_line();
        let rest = line.strip_prefix("-A ").unwrap_or(&line);
        self.comment(family, rule.table, format_args!("-D {rest}"))?;
        Ok(true)
    }

    fn flush_and_delete_chain(
        &mut self,
        family: IpFamily,
        table: Table,
        chain: &str,
    ) -> Result<bool, ApplyError> {
        self.comment(family, table, format_args!("-F {chain}"))?;
        self.comment(family, table, format_args!("-X {chain}"))?;
        Ok(true)
    }
}
