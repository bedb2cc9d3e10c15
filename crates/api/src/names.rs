//! Deterministic names for what a migration creates: the same migration always names its Jobs, DataVolumes and
//! VM the same, so a restarted controller finds them instead of making second copies. Names stay valid DNS-1123
//! labels of at most 63 characters; a name that would be longer is cut and made unique by a hash of the whole.

const MAX: usize = 63;
const HASH_LEN: usize = 10;

/// `<base>-<suffix>`, or `<cut base>-<hash>-<suffix>` when that would pass 63 characters. Dots (allowed in a
/// migration's name, not in a label) become dashes; the hash is of the original, so names stay distinct.
pub fn child_name(base: &str, suffix: &str) -> String {
    let original = if suffix.is_empty() {
        base.to_string()
    } else {
        format!("{base}-{suffix}")
    };
    let full = original.replace('.', "-");
    if full.len() <= MAX && full == original {
        return full;
    }
    let base = &base.replace('.', "-");
    let hash = format!("{:016x}", fnv1a(original.as_bytes()));
    let tail = if suffix.is_empty() {
        String::new()
    } else {
        format!("-{suffix}")
    };
    let room = MAX.saturating_sub(HASH_LEN + 1 + tail.len());
    let cut = base[..room.min(base.len())].trim_end_matches(['-', '.']);
    format!("{cut}-{}{tail}", &hash[..HASH_LEN])
}

/// `key` (a VM's name, path, uuid or moref) as a DNS label: lower case, every other character a dash, and, when
/// that changed it, a short hash of the original so that `a_b` and `a-b` stay apart.
pub fn dns_label(key: &str) -> String {
    let mapped: String = key
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    let label = if trimmed.is_empty() { "vm" } else { trimmed };
    if label == key {
        return child_name(label, "");
    }
    let hash = format!("{:016x}", fnv1a(key.as_bytes()));
    child_name(label, &hash[..6])
}

/// A plan's migration of the VM `key`: `<plan>-<key as a DNS label>`, at most 63 characters.
pub fn plan_child(plan: &str, key: &str) -> String {
    child_name(&format!("{plan}-{}", dns_label(key)), "")
}

/// FNV-1a, 64 bits: stable across Rust versions and platforms, unlike the standard hasher.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(name: &str) -> bool {
        let bytes = name.as_bytes();
        !name.is_empty()
            && name.len() <= MAX
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    }

    #[test]
    fn dots_become_dashes_without_collisions() {
        let (dotted, dashed) = (
            child_name("web.prod", "disk-0"),
            child_name("web-prod", "disk-0"),
        );
        assert!(is_dns_label(&dotted), "{dotted}");
        assert_eq!(dashed, "web-prod-disk-0");
        assert_ne!(dotted, dashed);
    }

    #[test]
    fn a_plans_migrations_are_named_after_their_vms_as_dns_labels() {
        assert_eq!(plan_child("wave-1", "web-01"), "wave-1-web-01");
        let (under, dash) = (
            plan_child("wave-1", "DC0_H0_VM0"),
            plan_child("wave-1", "dc0-h0-vm0"),
        );
        assert!(under.starts_with("wave-1-dc0-h0-vm0-"), "{under}");
        assert_ne!(under, dash);
        for key in [
            "/DC0/vm/folder/app 1",
            "4206b4a2-1c39-5b7c-4a36-2f0d9b6e1a11",
            "vm-42",
            "__",
            &"X".repeat(80),
        ] {
            let name = plan_child(&"p".repeat(60), key);
            assert!(is_dns_label(&name), "{key}: {name}");
            assert!(is_dns_label(&dns_label(key)), "{key}");
        }
    }

    #[test]
    fn short_names_read_plainly() {
        assert_eq!(child_name("legacy-vm", "disk-0"), "legacy-vm-disk-0");
        assert_eq!(child_name("legacy-vm", ""), "legacy-vm");
    }

    #[test]
    fn long_names_are_cut_hashed_unique_and_stable() {
        let a = "a".repeat(60) + "-first";
        let b = "a".repeat(60) + "-other";
        let (na, nb) = (child_name(&a, "convert-1"), child_name(&b, "convert-1"));
        assert!(is_dns_label(&na) && is_dns_label(&nb), "{na} {nb}");
        assert_ne!(na, nb, "a shared prefix must not collide");
        assert_eq!(na, child_name(&a, "convert-1"), "deterministic");
        assert!(na.ends_with("-convert-1"));
        // A cut landing on a dash never leaves a double dash or a trailing one.
        let dashed = format!("{}-{}", "x".repeat(43), "y".repeat(30));
        assert!(is_dns_label(&child_name(&dashed, "disk-12")));
        for len in 50..=253 {
            assert!(
                is_dns_label(&child_name(&"m".repeat(len), "disk-3")),
                "{len}"
            );
        }
    }
}
