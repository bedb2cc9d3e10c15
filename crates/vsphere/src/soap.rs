//! SOAP envelopes in, response elements or typed faults out.

use std::fmt::Write;

use crate::xml::{self, Element, escape};

/// A managed-object reference, such as `VirtualMachine:vm-42`. IDs differ between vCenter and ESXi, so they are
/// always read from the endpoint, never assumed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoRef {
    pub type_: String,
    pub value: String,
}

impl MoRef {
    pub fn new(type_: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            type_: type_.into(),
            value: value.into(),
        }
    }

    /// `<tag type="T">value</tag>`
    pub fn xml(&self, tag: &str) -> String {
        format!(
            r#"<{tag} type="{}">{}</{tag}>"#,
            escape(&self.type_),
            escape(&self.value)
        )
    }

    /// Reads a reference element: `<x type="Task">task-7</x>`, or `<x xsi:type="ManagedObjectReference" type=..>`.
    pub fn from_element(e: &Element) -> Option<Self> {
        Some(Self::new(e.attr("type")?, e.text.trim()))
    }
}

impl std::fmt::Display for MoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.type_, self.value)
    }
}

pub fn envelope(method: &str, this: &MoRef, args: &str) -> String {
    let mut out = String::with_capacity(256 + args.len());
    out.push_str(r#"<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body>"#);
    let _ = write!(
        out,
        r#"<{method} xmlns="urn:vim25">{}{args}</{method}>"#,
        this.xml("_this")
    );
    out.push_str("</soapenv:Body></soapenv:Envelope>");
    out
}

/// A SOAP fault: its vSphere type (from the detail's `xsi:type`) and the server's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub type_: String,
    pub message: String,
    pub detail: Option<Element>,
}

/// What a response body said.
#[derive(Debug)]
pub enum Response {
    /// The `<MethodResponse>` element.
    Ok(Element),
    Fault(Fault),
}

pub fn parse_response(method: &str, body: &str) -> Result<Response, xml::XmlError> {
    let envelope = xml::parse(body)?;
    let Some(body) = envelope.child("Body") else {
        return Err(xml::XmlError::msg(format!(
            "no SOAP Body in the answer to {method}"
        )));
    };
    if let Some(fault) = body.child("Fault") {
        return Ok(Response::Fault(decode_fault(fault)));
    }
    let wanted = format!("{method}Response");
    body.child(&wanted)
        .cloned()
        .map(Response::Ok)
        .ok_or_else(|| xml::XmlError::msg(format!("no {wanted} in the answer")))
}

/// The fault type is the `xsi:type` of the detail's child (for example `ManagedObjectNotFoundFault` typed
/// `ManagedObjectNotFound`); the element name, minus `Fault`, is the fallback.
pub fn decode_fault(fault: &Element) -> Fault {
    let message = fault
        .text_at(&["faultstring"])
        .unwrap_or_default()
        .to_string();
    let detail = fault
        .child("detail")
        .and_then(|d| d.children.first())
        .cloned();
    let type_ = detail
        .as_ref()
        .map(|d| {
            d.xsi_type
                .clone()
                .unwrap_or_else(|| d.name.trim_end_matches("Fault").to_string())
        })
        .unwrap_or_else(|| "ServerFault".to_string());
    Fault {
        type_,
        message,
        detail,
    }
}

/// Decodes a `LocalizedMethodFault` (a failed task's `info.error`).
pub fn decode_method_fault(error: &Element) -> Fault {
    let inner = error.child("fault");
    let type_ = inner
        .and_then(|f| f.xsi_type.clone())
        .unwrap_or_else(|| "MethodFault".to_string());
    let message = error
        .text_at(&["localizedMessage"])
        .unwrap_or_default()
        .to_string();
    Fault {
        type_,
        message,
        detail: inner.cloned(),
    }
}
