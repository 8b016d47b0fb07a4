//! Figures the benches write for the picture in docs/benchmarks.svg (see
//! `src/bin/picture.rs`): one CSV per bench, in the directory named by
//! `BENCH_RESULTS` (nothing is written without it).

use std::io::Write;
use std::path::PathBuf;

/// Writes `rows` under `header` to `$BENCH_RESULTS/<name>.csv`, replacing
/// the file; nothing when `BENCH_RESULTS` is not set.
pub fn write_csv(name: &str, header: &str, rows: &[String]) {
    let Some(dir) = std::env::var_os("BENCH_RESULTS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("BENCH_RESULTS directory");
    let path = dir.join(format!("{name}.csv"));
    let mut file = std::fs::File::create(&path).expect("results file");
    writeln!(file, "{header}").expect("write results");
    for row in rows {
        writeln!(file, "{row}").expect("write results");
    }
    println!("(figures written to {})", path.display());
}
