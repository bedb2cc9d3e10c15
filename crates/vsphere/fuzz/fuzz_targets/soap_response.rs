//! Any body a hostile endpoint sends: parsed, decoded as a fault or a property page and a VM's devices, never a
//! panic, an abort or a tree deeper or larger than the parser's bounds.
#![no_main]

use ferry_vsphere::soap::{Response, decode_method_fault, parse_response};
use ferry_vsphere::xml::{self, Element};
use ferry_vsphere::{inventory, props};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(tree) = xml::parse(body) {
        let (depth, elements) = measure(&tree);
        assert!(depth <= xml::MAX_DEPTH + 1, "depth {depth}");
        assert!(elements <= xml::MAX_ELEMENTS + 1, "{elements} elements");
    }
    for method in ["RetrievePropertiesEx", "Login"] {
        match parse_response(method, body) {
            Ok(Response::Ok(answer)) => decode(&answer),
            Ok(Response::Fault(fault)) => {
                let _ = fault.type_.len() + fault.message.len();
            }
            Err(_) => {}
        }
    }
});

/// Walks a page as the client does: every object, every property, a device list, a task's error.
fn decode(answer: &Element) {
    for page in answer.children_named("returnval") {
        let _ = page.text_at(&["token"]);
        for found in page.children_named("objects") {
            let Some(object) = props::object_content(found) else {
                continue;
            };
            for (_, value) in &object.props {
                let _ = inventory::decode_devices(value);
                let _ = decode_method_fault(value);
                let _ = inventory::power_state(&value.text);
            }
        }
    }
}

/// The tree's depth (the document root counts one) and element count, without recursion.
fn measure(root: &Element) -> (usize, usize) {
    let mut stack = vec![(root, 1usize)];
    let (mut deepest, mut count) = (0, 0);
    while let Some((node, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        count += 1;
        stack.extend(node.children.iter().map(|c| (c, depth + 1)));
    }
    (deepest, count)
}
