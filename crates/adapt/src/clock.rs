//! What a Windows guest keeps its hardware clock in. Windows reads the RTC as local time unless
//! `TimeZoneInformation\RealTimeIsUniversal` says UTC (the rule virt-v2v itself applies, `convert_windows.ml`): a
//! guest that keeps local time and boots on an RTC in UTC is off by its zone's offset until it next syncs. KubeVirt
//! takes an IANA zone (`clock.timezone`); Windows names its zones its own way (`W. Europe Standard Time`), and
//! Unicode CLDR's table maps one to the other.

use std::str::FromStr;

use nt_hive::{Hive, KeyNode, KeyValueDataType};
use serde::{Deserialize, Serialize};
use windows_timezones::WindowsTimezone;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum GuestClock {
    Utc,
    /// `windows_zone` is `TimeZoneKeyName` (Vista and later), or `StandardName` when that is all there is; empty
    /// when neither is set.
    LocalTime {
        windows_zone: String,
    },
}

impl GuestClock {
    /// Reads the current control set's `TimeZoneInformation` from a SYSTEM hive's bytes.
    pub fn from_system_hive(bytes: &[u8]) -> Result<GuestClock, String> {
        // A hive Windows did not flush before it stopped fails the sequence check; its keys are still readable.
        let hive =
            Hive::without_validation(bytes).map_err(|e| format!("not a registry hive: {e}"))?;
        let root = hive.root_key_node().map_err(|e| e.to_string())?;
        let control_set = current_control_set(&root);
        let path = format!(r"{control_set}\Control\TimeZoneInformation");
        let Some(zone) = root.subpath(&path) else {
            return Ok(GuestClock::LocalTime {
                windows_zone: String::new(),
            });
        };
        let zone = zone.map_err(|e| format!("{path}: {e}"))?;
        if real_time_is_universal(&zone)? {
            return Ok(GuestClock::Utc);
        }
        let named =
            |name: &str| string_value(&zone, name).filter(|v| !v.is_empty() && !v.starts_with('@'));
        Ok(GuestClock::LocalTime {
            windows_zone: named("TimeZoneKeyName")
                .or_else(|| named("StandardName"))
                .unwrap_or_default(),
        })
    }

    /// The IANA zone KubeVirt should run the VM's clock in; `None` for UTC, or for a zone CLDR does not know.
    pub fn iana_zone(&self) -> Option<&'static str> {
        match self {
            GuestClock::Utc => None,
            GuestClock::LocalTime { windows_zone } => WindowsTimezone::from_str(windows_zone)
                .ok()
                .map(WindowsTimezone::tzdb_id),
        }
    }

    /// For people, and what the VM does about it: for example `the guest keeps local time (W. Europe Standard
    /// Time), so the VM's clock runs in Europe/Berlin`.
    pub fn describe(&self) -> String {
        match (self, self.iana_zone()) {
            (GuestClock::Utc, _) => "the guest keeps its clock in UTC".into(),
            (GuestClock::LocalTime { windows_zone }, Some(zone)) => format!(
                "the guest keeps local time ({windows_zone}), so the VM's clock runs in {zone}"
            ),
            (GuestClock::LocalTime { windows_zone }, None) => format!(
                "the guest keeps local time in a zone with no IANA name ({}), so the VM's clock runs in UTC and \
                 the guest shows UTC until it syncs its time",
                if windows_zone.is_empty() {
                    "unnamed"
                } else {
                    windows_zone
                }
            ),
        }
    }
}

/// `ControlSet00N` from `Select\Current`; Windows boots `ControlSet001` when the value is missing.
fn current_control_set(root: &KeyNode<&[u8]>) -> String {
    let current = root
        .subkey("Select")
        .and_then(Result::ok)
        .and_then(|select| select.value("Current").and_then(Result::ok))
        .and_then(|value| value.dword_data().ok())
        .unwrap_or(1);
    format!("ControlSet{current:03}")
}

/// As virt-v2v reads it: absent or `REG_NONE` is local time, a DWORD or QWORD of 1 is UTC, any other type UTC.
fn real_time_is_universal(zone: &KeyNode<&[u8]>) -> Result<bool, String> {
    let Some(value) = zone.value("RealTimeIsUniversal") else {
        return Ok(false);
    };
    let value = value.map_err(|e| format!("RealTimeIsUniversal: {e}"))?;
    Ok(match value.data_type() {
        Ok(KeyValueDataType::RegNone) => false,
        Ok(KeyValueDataType::RegDWord) => value.dword_data().is_ok_and(|v| v == 1),
        Ok(KeyValueDataType::RegQWord) => value.qword_data().is_ok_and(|v| v == 1),
        _ => true,
    })
}

fn string_value(key: &KeyNode<&[u8]>, name: &str) -> Option<String> {
    key.value(name)?.ok()?.string_data().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_windows_zone_maps_to_cldrs_iana_zone() {
        let berlin = GuestClock::LocalTime {
            windows_zone: "W. Europe Standard Time".into(),
        };
        assert_eq!(berlin.iana_zone(), Some("Europe/Berlin"));
        assert_eq!(
            berlin.describe(),
            "the guest keeps local time (W. Europe Standard Time), so the VM's clock runs in Europe/Berlin"
        );
        let pacific = GuestClock::LocalTime {
            windows_zone: "Pacific Standard Time".into(),
        };
        assert_eq!(pacific.iana_zone(), Some("America/Los_Angeles"));
    }

    #[test]
    fn utc_and_unknown_zones_have_no_iana_zone() {
        assert_eq!(GuestClock::Utc.iana_zone(), None);
        assert_eq!(
            GuestClock::Utc.describe(),
            "the guest keeps its clock in UTC"
        );
        let unknown = GuestClock::LocalTime {
            windows_zone: "Mars Standard Time".into(),
        };
        assert_eq!(unknown.iana_zone(), None);
        assert!(
            unknown
                .describe()
                .contains("(Mars Standard Time), so the VM's clock runs in UTC"),
            "{}",
            unknown.describe()
        );
        let unnamed = GuestClock::LocalTime {
            windows_zone: String::new(),
        };
        assert!(unnamed.describe().contains("(unnamed)"));
    }

    #[test]
    fn the_clock_travels_as_json() {
        let local = GuestClock::LocalTime {
            windows_zone: "Tokyo Standard Time".into(),
        };
        let text = serde_json::to_string(&local).unwrap();
        assert_eq!(
            text,
            r#"{"localTime":{"windowsZone":"Tokyo Standard Time"}}"#
        );
        assert_eq!(serde_json::from_str::<GuestClock>(&text).unwrap(), local);
        assert_eq!(serde_json::to_string(&GuestClock::Utc).unwrap(), r#""utc""#);
    }

    #[test]
    fn bytes_that_are_no_hive_are_an_error() {
        assert!(GuestClock::from_system_hive(b"not a hive").is_err());
    }
}
