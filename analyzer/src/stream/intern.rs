//! String interning: every repeated string of a stream (client, node, namespace, method,
//! error type) is stored once and named by a small integer.

use rustc_hash::FxHashMap;

/// An interned string. [`Sym::NONE`] stands for "absent".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Sym(pub u32);

impl Sym {
    pub const NONE: Sym = Sym(0);

    pub fn is_some(self) -> bool {
        self != Self::NONE
    }
}

/// The strings the engine compares against, interned first so their symbols are constants.
pub mod known {
    use super::Sym;

    pub const READ: Sym = Sym(1);
    pub const WRITE: Sym = Sym(2);
    pub const OK: Sym = Sym(3);
    pub const CLIENT: Sym = Sym(4);
    pub const ROUTER: Sym = Sym(5);
    pub const SERVER: Sym = Sym(6);
    pub const FOLLOWER: Sym = Sym(7);
    pub const OBSERVER: Sym = Sym(8);
    pub const ACTIVE: Sym = Sym(9);

    pub(super) const TEXTS: &[&str] =
        &["read", "write", "ok", "client", "router", "server", "follower", "observer", "active"];
}

/// Strings to symbols and back. Grows with the number of distinct strings, not of records.
#[derive(Debug, Clone)]
pub struct Interner {
    symbols: FxHashMap<Box<str>, Sym>,
    strings: Vec<Box<str>>,
}

impl Default for Interner {
    fn default() -> Self {
        let mut interner = Self { symbols: FxHashMap::default(), strings: vec!["".into()] };
        for text in known::TEXTS {
            interner.intern(text);
        }
        interner
    }
}

impl Interner {
    pub fn intern(&mut self, text: &str) -> Sym {
        if let Some(sym) = self.symbols.get(text) {
            return *sym;
        }
        let sym = Sym(u32::try_from(self.strings.len()).expect("fewer than 2^32 distinct strings"));
        self.strings.push(text.into());
        self.symbols.insert(text.into(), sym);
        sym
    }

    pub fn intern_opt(&mut self, text: Option<&str>) -> Sym {
        text.map_or(Sym::NONE, |text| self.intern(text))
    }

    /// The string of `sym`; `None` for [`Sym::NONE`].
    pub fn get(&self, sym: Sym) -> Option<&str> {
        if sym == Sym::NONE { None } else { self.strings.get(sym.0 as usize).map(|text| &**text) }
    }

    /// The string of `sym` as an owned `Option<String>`, as the model's types hold it.
    pub fn owned(&self, sym: Sym) -> Option<String> {
        self.get(sym).map(str::to_string)
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.len() <= 1
    }
}
