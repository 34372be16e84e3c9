//! A store on simulated raw NAND flash: `--store nand:IMAGE`, `--vault nand`, the chip's wear in `status`.

use crate::session::{absolute, Global};
use oubli::report::{NandWearReport, StatusReport};
use oubli::{CreateOptions, CryptoProvider, Error, KdfParams, Options, SecretBytes, Store, Vault};
use oubli::{VaultError, VaultRecord};
use oubli_nand::{Geometry, NandMedium, NandVault, RATED_CYCLES};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Overrides the rated program/erase cycles per block of the projection.
pub const RATED_CYCLES_ENV: &str = "OUBLI_NAND_RATED_CYCLES";

/// The `--vault` address of the vault in the store's own chip.
pub const VAULT: &str = "nand";

/// The image of a `nand:IMAGE` store location, made absolute.
pub fn image_of(store: &Path) -> Option<PathBuf> {
    let text = store.to_str()?;
    text.strip_prefix("nand:").map(|p| absolute(Path::new(p)))
}

/// The local state directory (lock file, control socket) of a NAND store.
pub fn state_dir(image: &Path) -> PathBuf {
    let mut name = image.as_os_str().to_owned();
    name.push(".state");
    PathBuf::from(name)
}

/// Whether `address` names the vault in the store's chip.
pub fn is_nand_vault(address: &Path) -> bool {
    address == Path::new(VAULT)
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// The chip's `NandMedium`.
pub fn open_medium(image: &Path) -> Result<Arc<dyn oubli::Medium>, Error> {
    let medium = oubli_nand::open_medium(image)
        .map_err(io(format!("attaching NAND image {}", image.display())))?;
    Ok(Arc::new(medium))
}

/// The vault in the chip of the store at `image`.
pub fn open_vault(
    image: Option<&Path>,
    password: &SecretBytes,
    provider: &Arc<dyn CryptoProvider>,
) -> Result<Box<dyn Vault>, VaultError> {
    let image = image
        .ok_or_else(|| VaultError::Missing("--vault nand (it needs --store nand:IMAGE)".into()))?;
    let ubi = oubli_nand::attach(image).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => VaultError::Missing(image.display().to_string()),
        _ => VaultError::Io(e),
    })?;
    Ok(Box::new(NandVault::open(ubi, password, provider.clone())?))
}

/// Makes a vault elsewhere than in the chip for a store's first record.
pub type MakeVault<'a> = &'a dyn Fn(&VaultRecord) -> Result<Box<dyn Vault>, Error>;

/// Makes the chip image and the store on it, its vault in the chip
/// (`--vault nand`) or wherever `make_vault` puts it. The image is removed
/// again if the store cannot be made.
pub fn create_store(
    image: &Path,
    geometry: Geometry,
    password: &SecretBytes,
    kdf: KdfParams,
    create: CreateOptions,
    options: Options,
    make_vault: Option<MakeVault<'_>>,
) -> Result<Store, Error> {
    kdf.validate().map_err(Error::Invalid)?;
    if image.exists() {
        return Err(Error::AlreadyInitialized(format!(
            "nand:{}",
            image.display()
        )));
    }
    let ubi = oubli_nand::format(image, geometry)
        .map_err(io(format!("creating NAND image {}", image.display())))?;
    let made = NandMedium::new(ubi.clone())
        .map_err(io(format!("attaching NAND image {}", image.display())))
        .and_then(|medium| {
            let provider = options.provider.clone();
            Store::create(
                Arc::new(medium),
                |first| match make_vault {
                    Some(make) => make(first),
                    None => Ok(Box::new(NandVault::create(
                        ubi.clone(),
                        password,
                        kdf,
                        first,
                        provider,
                    )?) as Box<dyn Vault>),
                },
                create,
                options,
            )
        });
    if made.is_err() {
        drop(ubi);
        let _ = std::fs::remove_file(image);
    }
    made
}

/// The chip's wear, projected at the commit rate of the policy `status`
/// projects the vault's wear at.
pub fn wear(image: &Path, report: &StatusReport) -> Result<NandWearReport, Error> {
    let medium = oubli_nand::open_medium(image)
        .map_err(io(format!("attaching NAND image {}", image.display())))?;
    let commits_per_day = report.wear.as_ref().map_or(0.0, |w| w.commits_per_day);
    let rated = std::env::var(RATED_CYCLES_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(RATED_CYCLES);
    let now = medium.wear(rated, Some(0.0));
    let erases_per_commit = now.total_erases as f64 / report.epoch.max(1) as f64;
    let rate = erases_per_commit * commits_per_day / 24.0;
    let w = medium.wear(rated, Some(rate));
    Ok(NandWearReport {
        blocks: w.blocks + w.bad_blocks,
        bad_blocks: w.bad_blocks,
        erase_count_min: w.min,
        erase_count_mean: w.mean,
        erase_count_max: w.max,
        hoover_index: w.hoover,
        rated_cycles: w.rated_cycles,
        erases_per_commit,
        commits_per_day,
        projected_lifetime_years: w.lifetime_years,
    })
}

/// The wear lines of `status`.
pub fn render(w: &NandWearReport) -> String {
    let lifetime =
        w.projected_lifetime_years
            .map_or("unbounded (nothing erased yet)".into(), |y| {
                format!(
                    "{y:.1} years at {:.1} erasures per commit, {:.0} commits a day",
                    w.erases_per_commit, w.commits_per_day
                )
            });
    format!(
        "nand wear    erase counts {} / {:.1} / {} (min / mean / max) over {} blocks ({} bad), Hoover index {:.3}\n\
         nand life    {lifetime}, blocks rated for {} cycles\n",
        w.erase_count_min,
        w.erase_count_mean,
        w.erase_count_max,
        w.blocks,
        w.bad_blocks,
        w.hoover_index,
        w.rated_cycles,
    )
}

/// Fills in the NAND wear of a status report for a NAND store.
pub fn add_wear(g: &Global, report: &mut StatusReport) -> Result<(), crate::failure::Failure> {
    if let Some(image) = &g.nand {
        report.nand_wear = Some(wear(image, report).map_err(|e| g.fail(e))?);
    }
    Ok(())
}
