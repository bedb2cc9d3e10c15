//! Any descriptor a datastore serves: parsed, judged and its extent chosen, never a panic.
#![no_main]

use ferry_vsphere::vmdk::Descriptor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(descriptor) = Descriptor::parse(&text) else {
        return;
    };
    if let Some(refusal) = descriptor.refusal() {
        let _ = refusal.reason();
        let _ = refusal.to_string();
    }
    if let Ok(extent) = descriptor.flat_extent("[ds] vm/vm.vmdk") {
        let _ = format!("{extent:?}");
    }
});
