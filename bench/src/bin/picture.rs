//! Draws docs/benchmarks.svg, the picture that opens docs/benchmarks.md, from
//! the CSV files the benches write into `BENCH_RESULTS` (bench/results in the
//! repository): `mounted.csv` (`--bench mounted`), `loopback.csv`
//! (bench/scripts/loopback.sh) and `txn.csv` (`--bench txn`). A panel whose
//! file is missing says so. Run by bench/scripts/picture.sh:
//!
//! ```sh
//! cargo run -p tower-idempotency-bench --release --bin picture -- bench/results docs/benchmarks.svg
//! ```

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;
use std::path::Path;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Drawn = Result<(), Box<dyn std::error::Error>>;

const WIDTH: u32 = 1380;
const HEIGHT: u32 = 455;
const OURS: RGBColor = RGBColor(31, 119, 180);
const OURS_LIGHT: RGBColor = RGBColor(140, 190, 230);
const PEER: RGBColor = RGBColor(214, 110, 40);
const PEER_LIGHT: RGBColor = RGBColor(245, 185, 140);
const OTHER_PEER: RGBColor = RGBColor(150, 150, 150);
const BARE: RGBColor = RGBColor(60, 60, 60);
const INK: RGBColor = RGBColor(40, 40, 40);
const GRID: RGBColor = RGBColor(225, 225, 225);
const TARGET: RGBColor = RGBColor(200, 30, 30);

/// One horizontal bar: its label, its length, the text after it, its colour.
struct Bar {
    label: String,
    value: f64,
    note: String,
    color: RGBColor,
}

/// Rows of a CSV file as maps from its header's names; `None` if it is missing.
fn read_csv(path: &Path) -> Option<Vec<BTreeMap<String, String>>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let header: Vec<String> = lines.next()?.split(',').map(str::to_owned).collect();
    Some(
        lines
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                header
                    .iter()
                    .cloned()
                    .zip(l.split(',').map(str::to_owned))
                    .collect()
            })
            .collect(),
    )
}

fn number(row: &BTreeMap<String, String>, name: &str) -> f64 {
    row.get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Text of `size` pixels (plotters' SVG backend writes font sizes / 1.24).
fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", f64::from(size) * 1.24)
        .into_font()
        .color(&INK)
}

/// A panel: a title, a subtitle, bars from the left, the axis' largest value
/// `max` (longer bars are cut and marked), and a reference line.
fn panel(
    area: &Area,
    title: &str,
    subtitle: &str,
    bars: &[Bar],
    max: f64,
    reference: Option<(f64, &str)>,
) -> Drawn {
    let (w, h) = area.dim_in_pixel();
    let (w, h) = (w as i32, h as i32);
    area.draw(&Text::new(
        title.to_owned(),
        (10, 8),
        ("sans-serif", 16.0 * 1.24, FontStyle::Bold)
            .into_font()
            .color(&INK),
    ))?;
    for (i, line) in subtitle.lines().enumerate() {
        area.draw(&Text::new(
            line.to_owned(),
            (10, 30 + 15 * i as i32),
            font(12),
        ))?;
    }
    if bars.is_empty() {
        area.draw(&Text::new("no figures yet".to_owned(), (10, 90), font(14)))?;
        return Ok(());
    }
    let (left, right, top) = (172, w - 80, 72);
    let row = ((h - top - 50) / bars.len() as i32).min(44);
    let x = |v: f64| left + ((v / max).clamp(0.0, 1.0) * f64::from(right - left)) as i32;
    let bottom = top + row * bars.len() as i32;
    // Grid: five steps of a round size.
    let step = nice_step(max / 5.0);
    let mut tick = 0.0;
    while tick <= max * 1.0001 {
        let tx = x(tick);
        area.draw(&PathElement::new(
            vec![(tx, top - 4), (tx, bottom)],
            GRID.stroke_width(1),
        ))?;
        area.draw(&Text::new(
            short(tick),
            (tx, bottom + 6),
            font(11).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
        tick += step;
    }
    for (i, bar) in bars.iter().enumerate() {
        let y0 = top + row * i as i32 + 4;
        let y1 = y0 + row - 10;
        let mid = (y0 + y1) / 2;
        area.draw(&Text::new(
            bar.label.clone(),
            (left - 8, mid),
            font(12).pos(Pos::new(HPos::Right, VPos::Center)),
        ))?;
        if !bar.value.is_finite() {
            continue;
        }
        let end = x(bar.value);
        area.draw(&Rectangle::new(
            [(left, y0), (end.max(left + 1), y1)],
            bar.color.filled(),
        ))?;
        let cut = bar.value > max;
        if cut {
            // Cut at the axis' end: a white notch says the bar goes on.
            area.draw(&Rectangle::new(
                [(end - 14, y0 - 1), (end - 10, y1 + 1)],
                WHITE.filled(),
            ))?;
        }
        area.draw(&Text::new(
            bar.note.clone(),
            if cut { (end - 18, mid) } else { (end + 5, mid) },
            font(12)
                .pos(Pos::new(
                    if cut { HPos::Right } else { HPos::Left },
                    VPos::Center,
                ))
                .color(if cut { &WHITE } else { &INK }),
        ))?;
    }
    if let Some((value, label)) = reference {
        let rx = x(value);
        let mut y = top - 6;
        while y < bottom {
            area.draw(&PathElement::new(
                vec![(rx, y), (rx, (y + 6).min(bottom))],
                TARGET.stroke_width(2),
            ))?;
            y += 10;
        }
        area.draw(&Text::new(
            label.to_owned(),
            (rx, bottom + 22),
            font(12)
                .pos(Pos::new(HPos::Center, VPos::Top))
                .color(&TARGET),
        ))?;
    }
    Ok(())
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

fn short(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else {
        format!("{v}")
    }
}

/// Mounted in axum, current-thread: each layer's time over its do-nothing
/// route, next to the do-nothing route's own time.
fn mounted(area: &Area, dir: &Path) -> Drawn {
    let rows = read_csv(&dir.join("mounted.csv")).unwrap_or_default();
    let rows: Vec<_> = rows.iter().filter(|r| r["runtime"] == "current").collect();
    let find = |v: &str| rows.iter().find(|r| r["variant"] == v);
    let bare = find("do-nothing route_layer").map(|r| number(r, "ns_per_request") / 1000.0);
    let mut bars: Vec<Bar> = bare
        .map(|b| Bar {
            label: "the route itself".to_owned(),
            value: b,
            note: format!("{b:.2} µs"),
            color: BARE,
        })
        .into_iter()
        .collect();
    for (variant, label, color) in [
        ("ours/fresh", "ours, fresh key", OURS),
        ("idempotent/fresh", "idempotent, fresh", PEER),
        (
            "axum-idempotent/fresh",
            "axum-idempotent, fresh",
            OTHER_PEER,
        ),
        ("ours/replay", "ours, replay", OURS_LIGHT),
        ("idempotent/replay", "idempotent, replay", PEER_LIGHT),
        (
            "axum-idempotent/replay",
            "axum-idempotent, replay",
            OTHER_PEER,
        ),
    ] {
        if let Some(r) = find(variant) {
            let over =
                (number(r, "ns_per_request") - number(r, "baseline_ns_per_request")) / 1000.0;
            bars.push(Bar {
                label: label.to_owned(),
                value: over,
                note: format!("+{over:.2} µs"),
                color,
            });
        }
    }
    let ours = bars
        .iter()
        .find(|b| b.label == "ours, fresh key")
        .map_or(f64::NAN, |b| b.value);
    let max = bars
        .iter()
        .filter(|b| !b.label.starts_with("axum"))
        .map(|b| b.value)
        .chain(bare.map(|b| 1.5 * b))
        .fold(0.0, f64::max)
        * 1.35;
    let reference = bare.map(|b| (1.5 * b, "target for a fresh key: 1.5x the route".to_owned()));
    panel(
        area,
        "Time per request, in process",
        &format!(
            "the route's own, and each layer's over it (µs); axum Router,\ncurrent-thread, 1 KB JSON. Ours, fresh key: {:.2}x the route",
            ours / bare.unwrap_or(f64::NAN)
        ),
        &bars,
        if max > 0.0 { max } else { 1.0 },
        reference.as_ref().map(|(v, s)| (*v, s.as_str())),
    )
}

/// Loopback HTTP with wrk: requests/s, median over rounds.
fn loopback(area: &Area, dir: &Path) -> Drawn {
    let rows = read_csv(&dir.join("loopback.csv")).unwrap_or_default();
    let rps = |route: &str, scenario: &str| {
        let by_round: BTreeMap<String, f64> = rows
            .iter()
            .filter(|r| r["route"] == route && r["scenario"] == scenario)
            .map(|r| (r["round"].clone(), number(r, "rps")))
            .collect();
        by_round
    };
    let bare = rps("plain", "fresh");
    let mut bars = Vec::new();
    for (route, scenario, label, color) in [
        ("plain", "fresh", "bare route", BARE),
        ("memory", "fresh", "ours, fresh key", OURS),
        ("idempotent", "fresh", "idempotent, fresh", PEER),
        ("memory", "replay", "ours, replay", OURS_LIGHT),
        ("idempotent", "replay", "idempotent, replay", PEER_LIGHT),
    ] {
        let cell = rps(route, scenario);
        if cell.is_empty() {
            continue;
        }
        // The share of the bare route within each round, then the median.
        let share = median(
            cell.iter()
                .filter_map(|(round, v)| Some(v / bare.get(round)?))
                .collect(),
        );
        let value = median(cell.values().copied().collect());
        bars.push(Bar {
            label: label.to_owned(),
            value,
            note: if route == "plain" {
                format!("{:.0}k/s", value / 1000.0)
            } else {
                format!("{:.0}k/s, {:.0}%", value / 1000.0, 100.0 * share)
            },
            color,
        });
    }
    let max = bars.iter().map(|b| b.value).fold(0.0, f64::max) * 1.3;
    panel(
        area,
        "Requests/s over loopback HTTP",
        "wrk, 64 connections, one server thread, trivial handler,\n1 KB JSON; % of the bare route (targets: fresh 75%, replay 90%)",
        &bars,
        if max > 0.0 { max } else { 1.0 },
        None,
    )
}

/// Transactional mode against the bare handler, PostgreSQL with fsync on.
fn transactional(area: &Area, dir: &Path) -> Drawn {
    let rows = read_csv(&dir.join("txn.csv")).unwrap_or_default();
    let mut clients: Vec<u64> = rows.iter().map(|r| number(r, "clients") as u64).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut bars = Vec::new();
    for &n in &clients {
        let cell = |mode: &str| -> BTreeMap<String, f64> {
            rows.iter()
                .filter(|r| number(r, "clients") as u64 == n && r["mode"] == mode)
                .map(|r| (r["round"].clone(), number(r, "rps")))
                .collect()
        };
        let (bare, txn) = (cell("bare"), cell("transactional"));
        let share = median(
            txn.iter()
                .filter_map(|(round, v)| Some(v / bare.get(round)?))
                .collect(),
        );
        let word = if n == 1 { "client" } else { "clients" };
        let bare_rps = median(bare.values().copied().collect());
        bars.push(Bar {
            label: format!("bare, {n} {word}"),
            value: bare_rps,
            note: format!("{bare_rps:.0}/s"),
            color: BARE,
        });
        let txn_rps = median(txn.values().copied().collect());
        bars.push(Bar {
            label: format!("transactional, {n} {word}"),
            value: txn_rps,
            note: format!("{txn_rps:.0}/s, {share:.2}x"),
            color: OURS,
        });
    }
    let max = bars.iter().map(|b| b.value).fold(0.0, f64::max) * 1.3;
    panel(
        area,
        "Transactional mode, PostgreSQL",
        "a handler inserting one row, fsync on: bare, and with the\nrecord in its transaction; ratio to bare (target 0.9x)",
        &bars,
        if max > 0.0 { max } else { 1.0 },
        None,
    )
}

fn main() -> Drawn {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = Path::new(args.first().map_or("bench/results", String::as_str));
    let out = args.get(1).map_or("docs/benchmarks.svg", String::as_str);
    let root = SVGBackend::new(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let with_txn = dir.join("txn.csv").exists();
    let panels = root.split_evenly((1, if with_txn { 3 } else { 2 }));
    mounted(&panels[0], dir)?;
    loopback(&panels[1], dir)?;
    if with_txn {
        transactional(&panels[2], dir)?;
    }
    root.draw(&Text::new(
        format!(
            "Drawn by bench/scripts/picture.sh from {}/*.csv (the benches' own output); 2 shared vCPUs: see docs/benchmarks.md for the spread.",
            dir.display()
        ),
        (10, HEIGHT as i32 - 6),
        font(11).pos(Pos::new(HPos::Left, VPos::Bottom)),
    ))?;
    root.present()?;
    println!("drew {out}");
    Ok(())
}
