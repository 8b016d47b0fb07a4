//! Per-tenant bookkeeping of `MemoryJobStore`: what a budgeted start counts,
//! kept up to date as jobs change, so that counting never scans every job.

use crate::lease::store::{Budget, BudgetPeriod};
use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

/// The UTC day and month a job counts in, as days since the epoch and (year, month).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PeriodStarts {
    pub(super) day: i64,
    pub(super) month: (i64, u32),
}

impl PeriodStarts {
    /// The periods `at` falls in.
    pub(super) fn of(at: SystemTime) -> Self {
        let day = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| (d.as_secs() / 86_400) as i64);
        Self {
            day,
            month: year_month(day),
        }
    }

    /// The next period's first instant after `self`: RFC 3339, and seconds
    /// since the epoch.
    pub(super) fn next(self, period: BudgetPeriod) -> (String, u64) {
        let days = match period {
            BudgetPeriod::Day => self.day + 1,
            BudgetPeriod::Month => {
                let (year, month) = self.month;
                let (year, month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                days_from_civil(year, month, 1)
            }
        };
        let (year, month) = year_month(days);
        let day = days - days_from_civil(year, month, 1) + 1;
        (
            format!("{year:04}-{month:02}-{day:02}T00:00:00Z"),
            (days.max(0) as u64) * 86_400,
        )
    }

    /// Whether a job started in `self` counts in `today`'s `period`.
    pub(super) fn same(self, today: Self, period: BudgetPeriod) -> bool {
        match period {
            BudgetPeriod::Day => self.day == today.day,
            BudgetPeriod::Month => self.month == today.month,
        }
    }
}

/// Civil (year, month) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn year_month(days: i64) -> (i64, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month)
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// One tenant's jobs, as the budget and the erasure see them.
#[derive(Default)]
pub(super) struct TenantJobs {
    /// Every job id of the tenant.
    pub(super) jobs: HashSet<String>,
    /// Jobs not ended yet: they count while their lease is live.
    pub(super) in_flight: HashSet<String>,
    /// Units of completed jobs that count (not reset), per UTC day and month.
    complete_days: HashMap<i64, u64>,
    complete_months: HashMap<(i64, u32), u64>,
}

impl TenantJobs {
    /// A completed job's `cost` starts (`true`) or stops (`false`) counting in `period`.
    pub(super) fn count_complete(&mut self, period: PeriodStarts, cost: u64, counts: bool) {
        let step = |n: &mut u64| {
            *n = if counts {
                n.saturating_add(cost)
            } else {
                n.saturating_sub(cost)
            }
        };
        step(self.complete_days.entry(period.day).or_default());
        step(self.complete_months.entry(period.month).or_default());
        // Only the current periods are ever asked for: older ones may go.
        self.complete_days
            .retain(|day, n| *n > 0 && *day + 1 >= period.day);
        self.complete_months.retain(|_, n| *n > 0);
    }

    /// Units of completed jobs counted against `budget` in `today`'s period.
    pub(super) fn complete_in(&self, budget: Budget, today: PeriodStarts) -> u64 {
        match budget.period {
            BudgetPeriod::Day => self.complete_days.get(&today.day),
            BudgetPeriod::Month => self.complete_months.get(&today.month),
        }
        .copied()
        .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;

    const NINE: NonZeroU64 = NonZeroU64::new(9).unwrap();

    #[test]
    fn civil_months() {
        assert_eq!(year_month(0), (1970, 1));
        assert_eq!(year_month(31), (1970, 2));
        assert_eq!(year_month(20_666), (2026, 8)); // 2026-08-01
        assert_eq!(year_month(20_665), (2026, 7)); // 2026-07-31
        assert_eq!(year_month(11_016), (2000, 2)); // 2000-02-29
    }

    #[test]
    fn periods_end_at_the_next_utc_day_and_month() {
        let aug_31 = PeriodStarts {
            day: days_from_civil(2026, 8, 31),
            month: (2026, 8),
        };
        assert_eq!(aug_31.day, 20_696);
        assert_eq!(aug_31.next(BudgetPeriod::Day).0, "2026-09-01T00:00:00Z");
        assert_eq!(aug_31.next(BudgetPeriod::Month).0, "2026-09-01T00:00:00Z");
        let dec = PeriodStarts {
            day: days_from_civil(2026, 12, 1),
            month: (2026, 12),
        };
        assert_eq!(dec.next(BudgetPeriod::Month).0, "2027-01-01T00:00:00Z");
        assert_eq!(dec.next(BudgetPeriod::Day).0, "2026-12-02T00:00:00Z");
        let feb = PeriodStarts {
            day: days_from_civil(2028, 2, 28),
            month: (2028, 2),
        };
        assert_eq!(feb.next(BudgetPeriod::Day).0, "2028-02-29T00:00:00Z");
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 2, 29), 11_016);
    }

    #[test]
    fn completed_jobs_count_in_their_day_and_month_until_uncounted() {
        let mut tenant = TenantJobs::default();
        let today = PeriodStarts::of(SystemTime::now());
        tenant.count_complete(today, 1, true);
        tenant.count_complete(today, 1200, true);
        assert_eq!(tenant.complete_in(Budget::per_day(NINE), today), 1201);
        assert_eq!(tenant.complete_in(Budget::per_month(NINE), today), 1201);
        tenant.count_complete(today, 1200, false);
        assert_eq!(tenant.complete_in(Budget::per_day(NINE), today), 1);
        let tomorrow = PeriodStarts {
            day: today.day + 1,
            month: today.month,
        };
        assert_eq!(tenant.complete_in(Budget::per_day(NINE), tomorrow), 0);
    }
}
