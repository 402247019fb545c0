//! Energy accounting: what a query's measured work costs in joules, by component.
//!
//! The model is the one Do et al. 2013 measured and Kim et al. 2015 estimated: energy is the
//! sum, over the components of the whole system, of each component's static power over the
//! query's wall time and its dynamic cost for the work it did. Work is what Quarry counts on
//! every run (bytes read from flash, written to flash, moved over the link, CPU time on the
//! device and on the host), so pushdown and passthrough are priced by the same formula and
//! differ only in what they did: a filtered scan moves fewer bytes over the link and through
//! host memory, and spends device CPU instead of host CPU.
//!
//! The figures live in each device profile (`power`, [`DevicePower`]) and, for the host, in
//! [`HostPower`]; every figure names its source.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The components energy is reported by, in the order reports list them. Host components
/// first, then the link, then the device's.
pub const COMPONENTS: [&str; 9] =
    ["host_idle", "host_cpu", "host_dram", "link", "device_idle", "device_cpu", "device_dram", "flash_read", "flash_write"];

/// The components that make up the I/O subsystem (Do 2013 reports its energy apart from the
/// whole system's).
pub const IO_SUBSYSTEM: [&str; 6] = ["link", "device_idle", "device_cpu", "device_dram", "flash_read", "flash_write"];

/// A storage device's power figures (a device profile's `power` section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicePower {
    /// Where each figure comes from: papers and datasheets, by name.
    pub sources: String,
    /// Power the device draws whenever it is on, watts.
    pub idle_w: f64,
    /// Power of one busy device core above idle, watts.
    pub cpu_w: f64,
    /// Energy to read a byte from flash into the device's DRAM, nanojoules.
    pub flash_read_nj_per_byte: f64,
    /// Energy to write a byte to flash (spills), nanojoules.
    pub flash_write_nj_per_byte: f64,
    /// Energy to move a byte through the device's DRAM once, nanojoules.
    pub dram_nj_per_byte: f64,
    /// Energy to send a byte over the host interface, nanojoules.
    pub link_nj_per_byte: f64,
}

/// The host's power figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPower {
    /// Where each figure comes from.
    pub sources: String,
    /// Power the host draws when idle (the base all of Do 2013's figures include), watts.
    pub idle_w: f64,
    /// Power of one busy host core above idle, watts.
    pub cpu_w: f64,
    /// Energy to move a byte through host DRAM once, nanojoules.
    pub dram_nj_per_byte: f64,
}

impl HostPower {
    /// The server of Do et al. 2013 (sec. 4.1), the host the Smart SSD results were measured on.
    pub fn do_2013() -> Self {
        HostPower {
            sources: "idle_w: Do 2013 sec. 4.1 (the server drew 235 W idle); cpu_w: Do 2013 sec. 4.3 (host CPU about 65 W \
                      busy) over its 8 cores (two quad-core Xeon E5430, sec. 4.1); dram_nj_per_byte: Horowitz, \
                      'Computing's energy problem', ISSCC 2014 (a 64-bit DRAM access costs 1.3-2.6 nJ; 2 nJ / 8 bytes)"
                .into(),
            idle_w: 235.0,
            cpu_w: 65.0 / 8.0,
            dram_nj_per_byte: 0.25,
        }
    }
}

impl HostPower {
    /// The host's figures from a JSON file (`sources`, `idle_w`, `cpu_w`, `dram_nj_per_byte`).
    pub fn load(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading host power figures {path}: {e}"))?;
        let power: HostPower = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
        let figures = [("idle_w", power.idle_w), ("cpu_w", power.cpu_w), ("dram_nj_per_byte", power.dram_nj_per_byte)];
        check_figures("", &power.sources, &figures).map_err(|e| format!("{path}: {e}"))?;
        Ok(power)
    }
}

impl DevicePower {
    /// Every figure must be finite and not negative.
    pub fn validate(&self) -> Result<(), String> {
        let figures = [
            ("idle_w", self.idle_w),
            ("cpu_w", self.cpu_w),
            ("flash_read_nj_per_byte", self.flash_read_nj_per_byte),
            ("flash_write_nj_per_byte", self.flash_write_nj_per_byte),
            ("dram_nj_per_byte", self.dram_nj_per_byte),
            ("link_nj_per_byte", self.link_nj_per_byte),
        ];
        check_figures("power.", &self.sources, &figures)
    }
}

/// Power figures must be finite and not negative, and name their sources; errors name the
/// field (after `prefix`).
fn check_figures(prefix: &str, sources: &str, figures: &[(&str, f64)]) -> Result<(), String> {
    for (name, value) in figures {
        if !(value.is_finite() && *value >= 0.0) {
            return Err(format!("{prefix}{name} must be a number of at least 0, not {value}"));
        }
    }
    if sources.trim().is_empty() {
        return Err(format!("{prefix}sources must name where the figures come from"));
    }
    Ok(())
}

/// What one storage device did for a query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceWork {
    /// Bytes read from flash.
    pub bytes_read: u64,
    /// Bytes written to flash (spills).
    pub bytes_written: u64,
    /// Bytes sent to the host.
    pub bytes_over_link: u64,
    /// Time the device's cores were busy, seconds (on a slower device CPU, its own time).
    pub cpu_s: f64,
}

/// What a query did, as the energy model needs it.
#[derive(Debug, Clone, Default)]
pub struct Work<'a> {
    /// Wall time, seconds.
    pub wall_s: f64,
    /// CPU time of the host's operators, seconds.
    pub host_cpu_s: f64,
    /// Each device's work with its power figures.
    pub devices: Vec<(&'a DevicePower, DeviceWork)>,
}

/// A query's energy, in joules, by component.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Energy {
    /// The whole system's energy.
    pub energy_j: f64,
    /// The I/O subsystem's share (link and devices).
    pub io_subsystem_j: f64,
    /// Each of [`COMPONENTS`].
    pub energy_by_component: BTreeMap<String, f64>,
}

impl Energy {
    /// The energy of `work` on `host` and its devices.
    pub fn of(work: &Work, host: &HostPower) -> Self {
        let nj = |bytes: u64, per_byte: f64| bytes as f64 * per_byte * 1e-9;
        let mut parts: BTreeMap<String, f64> = COMPONENTS.iter().map(|c| (c.to_string(), 0.0)).collect();
        let mut add = |component: &str, joules: f64| *parts.get_mut(component).expect("a listed component") += joules;
        add("host_idle", host.idle_w * work.wall_s);
        add("host_cpu", host.cpu_w * work.host_cpu_s);
        for (power, device) in &work.devices {
            // Every byte the host receives is written to its memory once.
            add("host_dram", nj(device.bytes_over_link, host.dram_nj_per_byte));
            add("link", nj(device.bytes_over_link, power.link_nj_per_byte));
            add("device_idle", power.idle_w * work.wall_s);
            add("device_cpu", power.cpu_w * device.cpu_s);
            // Flash pages land in device DRAM, and what leaves goes out through it (Kim's
            // FMC-DRAM and DRAM-host DMAs).
            add("device_dram", nj(device.bytes_read + device.bytes_over_link, power.dram_nj_per_byte));
            add("flash_read", nj(device.bytes_read, power.flash_read_nj_per_byte));
            add("flash_write", nj(device.bytes_written, power.flash_write_nj_per_byte));
        }
        let energy_j = parts.values().sum();
        let io_subsystem_j = IO_SUBSYSTEM.iter().map(|c| parts[*c]).sum();
        Energy { energy_j, io_subsystem_j, energy_by_component: parts }
    }

    /// One line: the total and the largest components.
    pub fn summary(&self) -> String {
        let mut parts: Vec<(&String, &f64)> = self.energy_by_component.iter().filter(|(_, j)| **j > 0.0).collect();
        parts.sort_by(|a, b| b.1.total_cmp(a.1));
        let listed: Vec<String> = parts.iter().take(4).map(|(c, j)| format!("{c} {}", joules(**j))).collect();
        format!("energy {} (I/O subsystem {}; {})", joules(self.energy_j), joules(self.io_subsystem_j), listed.join(", "))
    }
}

/// Joules in a readable unit.
pub fn joules(j: f64) -> String {
    match j.abs() {
        x if x >= 1e3 => format!("{:.2} kJ", j / 1e3),
        x if x >= 1.0 => format!("{j:.2} J"),
        x if x >= 1e-3 => format!("{:.2} mJ", j * 1e3),
        _ => format!("{:.2} uJ", j * 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DevicePower {
        DevicePower {
            sources: "test".into(),
            idle_w: 1.0,
            cpu_w: 5.0,
            flash_read_nj_per_byte: 4.0,
            flash_write_nj_per_byte: 8.0,
            dram_nj_per_byte: 0.5,
            link_nj_per_byte: 2.0,
        }
    }

    fn host() -> HostPower {
        HostPower { sources: "test".into(), idle_w: 100.0, cpu_w: 10.0, dram_nj_per_byte: 1.0 }
    }

    #[test]
    fn each_component_is_its_figure_times_its_work() {
        let power = device();
        let work = Work {
            wall_s: 2.0,
            host_cpu_s: 0.5,
            devices: vec![(&power, DeviceWork { bytes_read: 1_000_000_000, bytes_written: 1_000_000, bytes_over_link: 10_000_000, cpu_s: 1.5 })],
        };
        let e = Energy::of(&work, &host());
        let c = |name: &str| e.energy_by_component[name];
        assert_eq!(c("host_idle"), 200.0);
        assert_eq!(c("host_cpu"), 5.0);
        assert!((c("host_dram") - 0.01).abs() < 1e-12);
        assert!((c("link") - 0.02).abs() < 1e-12);
        assert_eq!(c("device_idle"), 2.0);
        assert_eq!(c("device_cpu"), 7.5);
        assert!((c("device_dram") - 0.505).abs() < 1e-12);
        assert!((c("flash_read") - 4.0).abs() < 1e-12);
        assert!((c("flash_write") - 0.008).abs() < 1e-12);
        let total: f64 = COMPONENTS.iter().map(|n| c(n)).sum();
        assert!((e.energy_j - total).abs() < 1e-9);
        let io: f64 = IO_SUBSYSTEM.iter().map(|n| c(n)).sum();
        assert!((e.io_subsystem_j - io).abs() < 1e-9 && e.io_subsystem_j < e.energy_j);
    }

    #[test]
    fn moving_fewer_bytes_costs_less() {
        // The Smart SSD's case: the same flash read, the filter on the device, 1% over the link.
        let power = device();
        let read = 6_000_000_000;
        let passthrough = Work {
            wall_s: 10.0,
            host_cpu_s: 4.0,
            devices: vec![(&power, DeviceWork { bytes_read: read, bytes_over_link: read, ..Default::default() })],
        };
        let pushdown = Work {
            wall_s: 4.0,
            host_cpu_s: 0.1,
            devices: vec![(&power, DeviceWork { bytes_read: read, bytes_over_link: read / 100, cpu_s: 3.0, ..Default::default() })],
        };
        let (a, b) = (Energy::of(&passthrough, &host()), Energy::of(&pushdown, &host()));
        assert!(b.energy_j < a.energy_j / 2.0, "{} vs {}", b.energy_j, a.energy_j);
        assert!(b.energy_by_component["device_cpu"] > a.energy_by_component["device_cpu"]);
    }

    #[test]
    fn bad_figures_are_named() {
        let mut power = device();
        power.link_nj_per_byte = -1.0;
        assert!(power.validate().unwrap_err().contains("power.link_nj_per_byte"));
        power.link_nj_per_byte = 1.0;
        power.sources = " ".into();
        assert!(power.validate().unwrap_err().contains("sources"));
    }

    #[test]
    fn joules_pick_a_unit() {
        assert_eq!(joules(1234.0), "1.23 kJ");
        assert_eq!(joules(2.5), "2.50 J");
        assert_eq!(joules(0.0025), "2.50 mJ");
        assert_eq!(joules(2.5e-6), "2.50 uJ");
    }
}
