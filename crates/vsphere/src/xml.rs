//! A tiny namespace-aware DOM for SOAP responses. Element names are local names; `xsi:type` is resolved by
//! namespace URI, never by prefix, because vcsim writes `XMLSchema-instance:type` where vSphere writes `xsi:type`.

use quick_xml::NsReader;
use quick_xml::events::Event;
use quick_xml::name::{Namespace, ResolveResult};

const XSI: &str = "http://www.w3.org/2001/XMLSchema-instance";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    /// The `xsi:type` attribute without its prefix, for example `VirtualDisk` or `string`.
    pub xsi_type: Option<String>,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
    pub text: String,
}

#[derive(Debug, thiserror::Error)]
#[error("malformed XML from the vSphere endpoint: {0}")]
pub struct XmlError(String);

impl XmlError {
    pub fn msg(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl Element {
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The element at a path of child names.
    pub fn at(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |node, name| node.child(name))
    }

    /// The text of the element at a path of child names.
    pub fn text_at(&self, path: &[&str]) -> Option<&str> {
        self.at(path).map(|e| e.text.as_str())
    }

    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Depth-first search for the first descendant (or self) named `name`.
    pub fn find(&self, name: &str) -> Option<&Element> {
        if self.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(name))
    }
}

/// Deeper than any vSphere answer nests (a VM's devices sit about a dozen levels down). The tree is walked, cloned
/// and dropped recursively: a hostile endpoint's nesting must stop here, not at the end of the stack.
pub const MAX_DEPTH: usize = 128;

/// More elements than any answer holds (a page of 500 VMs' inventory properties is a few tens of thousands); each
/// costs about 120 bytes of tree, so a hostile body of empty elements is refused long before memory runs out.
pub const MAX_ELEMENTS: usize = 500_000;

pub fn parse(xml: &str) -> Result<Element, XmlError> {
    // No trimming: text around an entity reference arrives in pieces, and trimming would eat its spaces.
    let mut reader = NsReader::from_str(xml);
    // The document's root is kept under a synthetic element, popped at the end.
    let mut stack = vec![Element::default()];
    let mut elements = 0usize;
    loop {
        let (_, event) = reader
            .read_resolved_event()
            .map_err(|e| XmlError(e.to_string()))?;
        if matches!(event, Event::Start(_) | Event::Empty(_)) {
            elements += 1;
            if elements > MAX_ELEMENTS {
                return Err(XmlError(format!(
                    "more than {MAX_ELEMENTS} elements in one answer"
                )));
            }
        }
        match event {
            Event::Start(start) => {
                // The synthetic root is not counted.
                if stack.len() > MAX_DEPTH {
                    return Err(XmlError(format!(
                        "elements nested more than {MAX_DEPTH} deep"
                    )));
                }
                stack.push(element(&reader, &start)?)
            }
            Event::Empty(start) => {
                let done = element(&reader, &start)?;
                stack.last_mut().expect("root").children.push(done);
            }
            Event::End(_) => {
                let mut done = stack.pop().expect("balanced");
                if done.text.trim().is_empty() {
                    done.text.clear();
                }
                stack
                    .last_mut()
                    .ok_or_else(|| XmlError("unbalanced end tag".into()))?
                    .children
                    .push(done);
            }
            Event::Text(text) => stack
                .last_mut()
                .expect("root")
                .text
                .push_str(&text.xml10_content()),
            Event::CData(data) => {
                let bytes = data.into_inner();
                stack.last_mut().expect("root").text.push_str(&bytes);
            }
            Event::GeneralRef(reference) => {
                let resolved = match reference
                    .resolve_char_ref()
                    .map_err(|e| XmlError(e.to_string()))?
                {
                    Some(c) => c.to_string(),
                    None => match reference.xml10_content().as_ref() {
                        "amp" => "&".into(),
                        "lt" => "<".into(),
                        "gt" => ">".into(),
                        "quot" => "\"".into(),
                        "apos" => "'".into(),
                        other => return Err(XmlError(format!("unknown entity &{other};"))),
                    },
                };
                stack.last_mut().expect("root").text.push_str(&resolved);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let mut root = stack.pop().expect("root");
    if !stack.is_empty() {
        return Err(XmlError("unexpected end of document".into()));
    }
    root.children
        .pop()
        .ok_or_else(|| XmlError("empty document".into()))
}

fn element(
    reader: &NsReader<&[u8]>,
    start: &quick_xml::events::BytesStart<'_>,
) -> Result<Element, XmlError> {
    let mut element = Element {
        name: start.local_name().as_ref().to_string(),
        ..Element::default()
    };
    for attr in start.attributes() {
        let attr = attr.map_err(|e| XmlError(e.to_string()))?;
        let (ns, local) = reader.resolver().resolve_attribute(attr.key);
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| XmlError(e.to_string()))?
            .into_owned();
        let local = local.as_ref().to_string();
        let is_xsi = matches!(ns, ResolveResult::Bound(Namespace(uri)) if uri == XSI);
        if is_xsi && local == "type" {
            // `xsd:string` and `string` name the same type.
            element.xsi_type = Some(value.rsplit(':').next().unwrap_or(&value).to_string());
        } else if !is_xsi && !attr.key.as_ref().starts_with("xmlns") {
            element.attrs.push((local, value));
        }
    }
    Ok(element)
}

/// Escapes text for an XML element body.
pub fn escape(text: &str) -> String {
    quick_xml::escape::escape(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xsi_type_resolves_by_namespace_whatever_the_prefix() {
        for prefix in ["xsi", "XMLSchema-instance"] {
            let xml = format!(
                r#"<a xmlns:{prefix}="http://www.w3.org/2001/XMLSchema-instance"><val {prefix}:type="xsd:string">x &amp; y</val></a>"#
            );
            let root = parse(&xml).unwrap();
            let val = root.child("val").unwrap();
            assert_eq!(val.xsi_type.as_deref(), Some("string"), "prefix {prefix}");
            assert_eq!(val.text, "x & y");
        }
    }

    #[test]
    fn attributes_and_paths() {
        let root = parse(r#"<r><returnval type="Task">task-7</returnval><e/></r>"#).unwrap();
        let val = root.child("returnval").unwrap();
        assert_eq!(
            (val.attr("type"), val.text.as_str()),
            (Some("Task"), "task-7")
        );
        assert!(root.at(&["e"]).is_some());
        assert!(root.find("returnval").is_some());
    }

    #[test]
    fn hostile_nesting_and_floods_are_refused_not_followed() {
        let nested = |depth: usize| format!("{}{}", "<a>".repeat(depth), "</a>".repeat(depth));
        assert!(parse(&nested(MAX_DEPTH)).is_ok());
        let err = parse(&nested(MAX_DEPTH + 1)).unwrap_err().to_string();
        assert!(err.contains("nested more than 128 deep"), "{err}");
        // A million levels: refused at once, with the stack untouched.
        assert!(parse(&nested(1_000_000)).is_err());
        let flood = format!("<r>{}</r>", "<e/>".repeat(MAX_ELEMENTS));
        let err = parse(&flood).unwrap_err().to_string();
        assert!(err.contains("more than 500000 elements"), "{err}");
    }
}
