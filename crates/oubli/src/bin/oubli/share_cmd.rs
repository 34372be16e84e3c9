//! `oubli share create|ls|destroy`: second secrets in vaults of their own; destroying one erases everything placed under it, everywhere, at once.

use crate::failure::Failure;
use crate::session::{self, Access, Global};
use crate::ui;
use clap::Subcommand;
use oubli::crates::vault::create_vault;
use oubli::{Error, KdfParams};
use serde::Serialize;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum ShareCommand {
    /// Create a share whose key lives only in its own vault (a file, tpm:..., pkcs11:...)
    Create {
        name: String,
        /// Where the share's key is kept: a new file vault, a TPM index or a token (same password as the store)
        #[arg(long, value_name = "ADDRESS")]
        share_vault: PathBuf,
    },
    /// List the shares, destroyed ones included
    Ls {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Destroy a share's key: everything ever placed under it becomes unrecoverable, everywhere
    Destroy {
        name: String,
        /// Do not ask for confirmation
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        cert: crate::cert_cmd::CertArgs,
    },
}

#[derive(Serialize)]
struct ShareEntry {
    id: u32,
    name: String,
    vault: String,
    created_at: u64,
    destroyed_at: Option<u64>,
}

pub fn run(g: &Global, command: ShareCommand) -> Result<String, Failure> {
    match command {
        ShareCommand::Create { name, share_vault } => create(g, &name, &share_vault),
        ShareCommand::Ls { json } => ls(g, json),
        ShareCommand::Destroy { name, yes, cert } => destroy(g, &name, yes, &cert),
    }
}

fn create(g: &Global, name: &str, address: &Path) -> Result<String, Failure> {
    oubli::crates::core::share::check_name(name).map_err(Failure::usage)?;
    let address = session::vault_address(Some(address.to_path_buf()));
    let location = address.to_string_lossy().into_owned();
    let session = g.open(Access::Write)?;
    let provider = session::provider();
    let password = session.password.clone();
    session
        .store
        .share_create(name, &location, |record| {
            create_vault(
                &location,
                &password,
                KdfParams::default(),
                record,
                provider.clone(),
            )
            .map_err(Error::Vault)
        })
        .map_err(|e| g.fail(e))?;
    Ok(format!(
        "created share {name}; its key is only in {} (same password as the store). \
         Place data under it with `oubli put --share {name}` or, on a mount, the xattr user.oubli.share={name} on a directory\n",
        session::shown(&address)
    ))
}

fn ls(g: &Global, json: bool) -> Result<String, Failure> {
    let session = g.open(Access::Read)?;
    let entries: Vec<ShareEntry> = session
        .store
        .shares()
        .into_iter()
        .map(|s| ShareEntry {
            id: s.id,
            name: s.name,
            vault: session::shown(Path::new(&s.vault)),
            created_at: s.created_at,
            destroyed_at: s.destroyed_at,
        })
        .collect();
    if json {
        return Ok(serde_json::to_string_pretty(&entries).expect("plain data") + "\n");
    }
    let mut out = String::new();
    for s in entries {
        let state = match s.destroyed_at {
            Some(t) => format!("destroyed {} UTC", ui::date(t)),
            None => format!("created {} UTC", ui::date(s.created_at)),
        };
        out.push_str(&format!("{:<20} {:<32}  {state}\n", s.name, s.vault));
    }
    Ok(out)
}

fn destroy(
    g: &Global,
    name: &str,
    yes: bool,
    cert: &crate::cert_cmd::CertArgs,
) -> Result<String, Failure> {
    let request = crate::cert_cmd::prepare(cert, true)?;
    if !yes {
        confirm(name)?;
    }
    let (session, mut tally) = crate::cert_cmd::open(g, request.is_some())?;
    let share = session
        .store
        .shares()
        .into_iter()
        .find(|s| s.name == name && s.destroyed_at.is_none())
        .ok_or_else(|| g.fail(Error::NoShare(name.to_string())))?;
    let provider = session::provider();
    let vault = g.open_vault_at(Path::new(&share.vault), &session.password, &provider)?;
    // What the certificate states: the objects under the share, before.
    let mut under = (Vec::new(), 0);
    if request.is_some() {
        for (oid, record) in session.store.objects().map_err(|e| g.fail(e))? {
            if session
                .store
                .share_of(oid)
                .map_err(|e| g.fail(e))?
                .as_deref()
                == Some(name)
            {
                under.0.push(oid);
                under.1 += record.size;
            }
        }
    }
    if let Some(tally) = &mut tally {
        tally.before_commit(g, &session)?;
    }
    session
        .store
        .share_destroy(name, &*vault)
        .map_err(|e| g.fail(e))?;
    let mut out = format!(
        "destroyed share {name}: its key in {} is overwritten and the store committed; everything placed under it is unrecoverable, in every snapshot and every old copy of the store\n",
        session::shown(Path::new(&share.vault))
    );
    if let (Some(mut request), Some(tally)) = (request, tally) {
        request.share_vault(&vault.info());
        let item = oubli::certificate::ErasedItem {
            kind: oubli::certificate::ItemKind::Share,
            name: request.name(name),
            object_ids: under.0,
            bytes: under.1,
            from_snapshots: Vec::new(),
        };
        out += &crate::cert_cmd::finish(
            request,
            g,
            &session,
            tally,
            "oubli share destroy",
            vec![item],
            Vec::new(),
        )?;
    }
    Ok(out)
}

/// Asks the user to type the share's name; refuses without a terminal.
fn confirm(name: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::usage(format!(
            "destroying share {name} cannot be undone: give --yes to confirm (no terminal to ask on)"
        )));
    }
    eprint!("Destroying share {name} makes everything under it unrecoverable. Type its name to confirm: ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Failure::file("reading the confirmation", e))?;
    if line.trim_end_matches(['\n', '\r']) != name {
        return Err(Failure::usage("not confirmed: nothing was destroyed"));
    }
    Ok(())
}
