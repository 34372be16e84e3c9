//! Put a secret in a store, delete it, commit, and let the audit show that it cannot be recovered.
//!
//! Run with `cargo run -p oubli --example erase`.

use oubli::{CreateOptions, EpochPolicy, KdfParams, Options, SecretBytes, ROOT_DIR};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let password = SecretBytes::new(b"an example password".to_vec());
    // Manual epochs, so that the example decides when erasure happens.
    let options = Options {
        policy: EpochPolicy::manual(),
        ..Options::default()
    };
    let store = oubli::create_dir_store(
        dir.path().join("store"),
        dir.path().join("vault"),
        &password,
        KdfParams::default(),
        CreateOptions::default(),
        options,
    )?;

    let secret = store.create_object(b"")?;
    store.write(secret, 0, b"the combination is 12-34-56")?;
    store.link(ROOT_DIR, b"secret", secret)?;
    store.flush()?;
    println!("stored the secret (epoch {})", store.epoch());

    store.unlink(ROOT_DIR, b"secret")?;
    store.delete(secret)?;
    let report = store.audit()?;
    println!(
        "deleted it: {} unit(s) still open with the current vault key until the next commit",
        report.pending_units
    );

    store.commit()?;
    let report = store.audit()?;
    println!(
        "committed epoch {}: live {}, pending {}, leaked {}",
        store.epoch(),
        report.live_units,
        report.pending_units,
        report.leaked_units
    );
    if report.pending_units + report.leaked_units == 0 {
        println!("verdict: the secret no longer opens: its key sat in a tree sealed by an epoch key the vault no longer holds");
        Ok(())
    } else {
        Err("verdict: deleted data is still recoverable".into())
    }
}
