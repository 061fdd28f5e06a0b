//! Loading the real object: the verifier accepts it within an instruction budget, it defines
//! every map of the ABI, and the pinned maps are what the agent writes.
//!
//! Privileged: needs root and BPF (skips loudly otherwise; a failure under `CI=true`).

use std::fs;

use anyhow::{Context as _, Result, ensure};
use aya::maps::{Array, Map, MapData};
use router_common::{
    MAGLEV_LANES, MAGLEV_SIZE, MAX_BACKENDS, NO_BACKEND, maglev_backend, maglev_index, maps,
};
use router_tests::privileged;
use switchyard::dataplane::{Dataplane as _, load, maps::KernelMaps};

/// Instructions the verifier may process for the program (kernel limit: 1,000,000). The
/// program needs about 91,000 on 6.18 (65,700 before client classes, decision 0036;
/// `switchyard_ipip` about 9,000); the budget catches a change that multiplies verifier states
/// (see parse.rs on the scratch map, class.rs on lookup keys) long before the kernel limit does.
const VERIFIER_BUDGET: u32 = 150_000;

#[test]
fn program_verifies_within_its_instruction_budget() -> Result<()> {
    if privileged::require_root_and_bpf("verifier budget").is_err() {
        return Ok(());
    }
    let ebpf = load::load(None)?;
    let info = load::program(&ebpf)?.info()?;
    let verified = info
        .verified_instruction_count()
        .context("kernel reports no count")?;
    println!(
        "verified instructions: {verified} (budget {VERIFIER_BUDGET}); translated {} bytes, jited {} bytes",
        info.size_translated().unwrap_or(0),
        info.size_jitted()
    );
    ensure!(
        verified <= VERIFIER_BUDGET,
        "{verified} verified instructions > budget {VERIFIER_BUDGET}"
    );
    // The ipip encapsulation, tail-called by the data plane: a program of its own.
    let prog: &aya::programs::Xdp = ebpf
        .program(switchyard::dataplane::object::IPIP_PROGRAM)
        .context("no ipip program")?
        .try_into()?;
    let ipip = prog
        .info()?
        .verified_instruction_count()
        .context("kernel reports no count")?;
    println!("switchyard_ipip verified instructions: {ipip} (budget {VERIFIER_BUDGET})");
    ensure!(
        ipip <= VERIFIER_BUDGET,
        "switchyard_ipip: {ipip} verified instructions > budget {VERIFIER_BUDGET}"
    );
    Ok(())
}

#[test]
fn the_object_defines_every_map_of_the_abi() -> Result<()> {
    if privileged::require_root_and_bpf("object maps").is_err() {
        return Ok(());
    }
    let ebpf = load::load(None)?;
    for name in maps::ALL {
        ensure!(
            ebpf.map(name).is_some(),
            "map {name} missing from the object"
        );
    }
    Ok(())
}

/// Tables are written through a memory mapping of `MAGLEV`, 16-bit entries side by side in
/// 8-byte values (the kernel's stride between array values); read back through the syscall,
/// each entry is in the lane and value `maglev_index` names, `NO_BACKEND` is the empty entry,
/// and the neighbouring tables are untouched. A table with a slot that does not fit an entry
/// is refused whole.
#[test]
fn maglev_tables_written_through_the_mapping_read_back_through_the_syscall() -> Result<()> {
    if privileged::require_root_and_bpf("maglev mapping").is_err() {
        return Ok(());
    }
    let dir = std::path::PathBuf::from(router_tests::agent::unique_pin_path());
    let result = (|| -> Result<()> {
        let mut ebpf = load::load(Some(&dir))?;
        let mut kernel = KernelMaps::take(&mut ebpf)?;
        let table: Vec<u32> = (0..MAGLEV_SIZE)
            .map(|i| {
                if i % 7 == 3 {
                    NO_BACKEND
                } else {
                    i.wrapping_mul(2_654_435_761) % MAX_BACKENDS
                }
            })
            .collect();
        kernel.write_table(5, 1, &table)?;
        let pinned = MapData::from_pin(dir.join(maps::MAGLEV))?;
        let array: Array<MapData, [u16; 4]> = Array::try_from(Map::Array(pinned))?;
        let entry = |pool, half, i| -> Result<u16> {
            let at = maglev_index(pool, half, i);
            Ok(array.get(&(at / MAGLEV_LANES), 0)?[(at % MAGLEV_LANES) as usize])
        };
        for i in [0, 1, 2, 3, 4, 10, 1000, MAGLEV_SIZE / 2, MAGLEV_SIZE - 1] {
            let got = entry(5, 1, i)?;
            ensure!(
                maglev_backend(got) == table[i as usize],
                "entry {i}: kernel has {got}, wrote {}",
                table[i as usize]
            );
            ensure!(
                kernel.table_entry(5, 1, i) == Some(table[i as usize]),
                "entry {i} through the mapping"
            );
        }
        // Its neighbours were not touched.
        ensure!(entry(5, 0, MAGLEV_SIZE - 1)? == 0, "half 0 was written");
        ensure!(entry(6, 0, 0)? == 0, "pool 6 was written");
        let mut too_big = table.clone();
        too_big[MAGLEV_SIZE as usize - 1] = u32::from(u16::MAX);
        ensure!(
            kernel.write_table(5, 1, &too_big).is_err(),
            "a slot past 16 bits was taken"
        );
        ensure!(
            kernel.table_entry(5, 1, MAGLEV_SIZE - 1) == Some(table[MAGLEV_SIZE as usize - 1]),
            "a refused table was written in part"
        );
        Ok(())
    })();
    for name in maps::ALL {
        let _ = fs::remove_file(dir.join(name));
    }
    let _ = fs::remove_dir(&dir);
    result
}
