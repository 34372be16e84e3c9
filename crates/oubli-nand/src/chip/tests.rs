//! Tests of the chip's rules: program once and in order, erase, wear, bad blocks, cuts, the image file.

use super::*;

pub(crate) fn small() -> Geometry {
    Geometry {
        page_size: 512,
        pages_per_block: 16,
        blocks: 16,
        oob_bytes: 32,
    }
}

#[test]
fn pages_are_programmed_once_and_in_order() {
    let chip = NandChip::in_memory(small(), &[], None).unwrap();
    let (main, oob) = chip.read_page(0, 0).unwrap();
    assert!(
        main.iter().chain(&oob).all(|&b| b == 0xFF),
        "erased reads 0xFF"
    );
    chip.program(0, 0, b"first", b"oob").unwrap();
    let twice = chip.program(0, 0, b"again", b"").unwrap_err();
    assert_eq!(twice.kind(), ErrorKind::InvalidInput, "{twice}");
    chip.program(0, 3, b"skip ahead", b"").unwrap();
    let back = chip.program(0, 2, b"back", b"").unwrap_err();
    assert_eq!(back.kind(), ErrorKind::InvalidInput, "{back}");
    let (main, oob) = chip.read_page(0, 0).unwrap();
    assert_eq!(&main[..5], b"first");
    assert_eq!(main[5], 0xFF);
    assert_eq!(&oob[..3], b"oob");
    assert!(chip.program(0, 4, &[0; 513], b"").is_err());
}

#[test]
fn erase_resets_the_block_and_counts() {
    let chip = NandChip::in_memory(small(), &[], None).unwrap();
    chip.program(1, 0, b"data", b"").unwrap();
    chip.program(2, 0, b"other", b"").unwrap();
    chip.erase(1).unwrap();
    assert_eq!(chip.erase_count(1), 1);
    assert_eq!(chip.erase_count(2), 0);
    assert!(chip.read_page(1, 0).unwrap().0.iter().all(|&b| b == 0xFF));
    assert_eq!(&chip.read_page(2, 0).unwrap().0[..5], b"other");
    chip.program(1, 0, b"reused", b"").unwrap();
    // Counts and programmed pages survive a power-up from the image.
    let again = NandChip::from_image(chip.image().unwrap()).unwrap();
    assert_eq!(again.erase_count(1), 1);
    assert_eq!(again.programmed_pages(1), 1);
    assert!(again.program(1, 0, b"x", b"").is_err());
}

#[test]
fn bad_and_worn_blocks_refuse_work() {
    let chip = NandChip::in_memory(small(), &[5], Some(2)).unwrap();
    assert!(chip.is_bad(5));
    assert!(is_bad_block(&chip.program(5, 0, b"x", b"").unwrap_err()));
    assert!(is_bad_block(&chip.erase(5).unwrap_err()));
    chip.erase(3).unwrap();
    assert!(is_bad_block(&chip.erase(3).unwrap_err()), "worn out");
    assert!(chip.is_bad(3));
    assert!(NandChip::in_memory(small(), &[16], None).is_err());
}

#[test]
fn a_cut_tears_a_program_and_kills_the_chip() {
    let chip = NandChip::in_memory(small(), &[], None).unwrap();
    chip.program(0, 0, &[1; 512], b"").unwrap();
    chip.arm_cut(1, Some(100));
    assert!(is_power_cut(
        &chip.program(0, 1, &[2; 512], &[3; 32]).unwrap_err()
    ));
    assert!(is_power_cut(&chip.erase(4).unwrap_err()));
    let again = NandChip::from_image(chip.image().unwrap()).unwrap();
    let (main, oob) = again.read_page(0, 1).unwrap();
    assert_eq!(main[..100], [2; 100]);
    assert_eq!(main[100], 0xFF);
    assert_eq!(oob, [0xFF; 32]);
    assert_eq!(again.programmed_pages(0), 2, "a torn page is not erased");
    // A cut erase does nothing.
    again.arm_cut(0, None);
    assert!(again.erase(0).is_err());
    assert_eq!(again.read_page(0, 0).unwrap().0, [1; 512]);
}

#[test]
fn remapping_erase_keeps_ghosts_and_history_keeps_every_state() {
    let chip = NandChip::in_memory(small(), &[], None).unwrap();
    chip.record_history(true);
    chip.program(2, 0, b"secret", b"").unwrap();
    chip.erase(2).unwrap();
    assert_eq!(chip.history().len(), 1);
    let found = |blocks: Vec<(u32, Vec<u8>)>| {
        blocks
            .iter()
            .any(|(_, raw)| raw.windows(6).any(|w| w == b"secret"))
    };
    assert!(!found(chip.chip_off().unwrap()), "an honest erase destroys");
    chip.set_erase_remaps(true);
    chip.program(2, 0, b"secret", b"").unwrap();
    chip.erase(2).unwrap();
    assert!(
        found(chip.chip_off().unwrap()),
        "a remapping erase does not"
    );
}

#[test]
fn the_image_file_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chip.img");
    let chip = NandChip::create(&path, small(), &[7], None).unwrap();
    chip.program(1, 0, b"kept", b"").unwrap();
    chip.erase(2).unwrap();
    chip.sync().unwrap();
    drop(chip);
    assert!(NandChip::create(&path, small(), &[], None).is_err());
    let chip = NandChip::open(&path).unwrap();
    assert_eq!(chip.geometry(), small());
    assert!(chip.is_bad(7));
    assert_eq!(chip.erase_count(2), 1);
    assert_eq!(&chip.read_page(1, 0).unwrap().0[..4], b"kept");
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(len, 4096 + 16 * 16 * 544);
}
