//! The cursor over one line of the text IR: words, names, lists, numbers
//! and `key=value` attributes, each failure an `Error::Parse` naming the
//! line and what was found.

use super::{clip, parse_err, Attr, Attrs};
use crate::Error;
use crate::Result;

/// A position in one line.
pub(super) struct Cursor<'a> {
    pub(super) s: &'a str,
    pub(super) pos: usize,
    pub(super) line: usize,
}

/// Characters that end a word: whitespace and the punctuation of the format.
fn is_word_char(c: char) -> bool {
    !c.is_whitespace() && !"%:=,[]@!".contains(c)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

impl<'a> Cursor<'a> {
    pub(super) fn err(&self, message: impl Into<String>) -> Error {
        parse_err(self.line, message)
    }

    pub(super) fn skip_ws(&mut self) {
        let rest = &self.s[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    pub(super) fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.s[self.pos..].chars().next()
    }

    pub(super) fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    pub(super) fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    pub(super) fn rest(&mut self) -> &'a str {
        let r = &self.s[self.pos..];
        self.pos = self.s.len();
        r
    }

    pub(super) fn expect(&mut self, c: char, context: &str) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected '{c}' {context}, found {}", self.found())))
        }
    }

    /// The next token, quoted, for messages (`end of line` at the end).
    pub(super) fn found(&self) -> String {
        let rest = self.s[self.pos..].trim_start();
        let Some(c) = rest.chars().next() else { return "end of line".into() };
        let token = if is_word_char(c) {
            rest.split(|c: char| !is_word_char(c)).next().unwrap_or(rest)
        } else if c == '%' {
            let end = rest[1..].find(|c: char| !is_name_char(c)).map_or(rest.len(), |i| i + 1);
            &rest[..end]
        } else {
            &rest[..c.len_utf8()]
        };
        format!("'{}'", clip(token))
    }

    pub(super) fn word(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let rest = &self.s[self.pos..];
        let end = rest.find(|c: char| !is_word_char(c)).unwrap_or(rest.len());
        if end == 0 {
            return None;
        }
        self.pos += end;
        Some(&rest[..end])
    }

    /// `%name`, returning `name`.
    pub(super) fn value_name(&mut self) -> Result<&'a str> {
        if !self.eat('%') {
            return Err(self.err(format!("expected a value like %3, found {}", self.found())));
        }
        let rest = &self.s[self.pos..];
        let end = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
        if end == 0 {
            return Err(self.err("expected a value name after '%' (letters, digits and '_', e.g. %3 or %x)"));
        }
        self.pos += end;
        Ok(&rest[..end])
    }

    /// The words of a `[a,b,...]` list whose '[' was just eaten.
    pub(super) fn list(&mut self, what: &str) -> Result<Vec<&'a str>> {
        let mut items = Vec::new();
        if self.eat(']') {
            return Ok(items);
        }
        loop {
            let w = self
                .word()
                .ok_or_else(|| self.err(format!("expected a {what} element, found {}", self.found())))?;
            items.push(w);
            if self.eat(']') {
                return Ok(items);
            }
            if !self.eat(',') {
                return Err(self.err(format!("expected ',' or ']' in the {what}, found {}", self.found())));
            }
        }
    }

    pub(super) fn number(&self, w: &str, what: &str) -> Result<usize> {
        w.parse::<usize>()
            .map_err(|_| self.err(format!("expected a non-negative integer for {what}, found '{}'", clip(w))))
    }

    /// Attributes up to the region marker or the end of the line.
    pub(super) fn attrs(&mut self, op: &str) -> Result<Attrs<'a>> {
        let mut items: Vec<(&'a str, Attr<'a>)> = Vec::new();
        loop {
            match self.peek() {
                None | Some('@') | Some('!') => return Ok(Attrs { items }),
                Some('%') => {
                    return Err(self.err(format!("expected ',' between operands, before {}", self.found())))
                }
                _ => {}
            }
            let key = self.word().ok_or_else(|| self.err(format!("unexpected {}", self.found())))?;
            let value = if self.eat('=') {
                if self.eat('[') {
                    Attr::List(self.list(&format!("list of {key}"))?)
                } else {
                    Attr::Word(self.word().ok_or_else(|| {
                        self.err(format!("expected a value after '{key}=', found {}", self.found()))
                    })?)
                }
            } else {
                Attr::Bare
            };
            if !matches!(value, Attr::Bare)
                && items.iter().any(|(k, v)| *k == key && !matches!(v, Attr::Bare))
            {
                return Err(self.err(format!("attribute '{key}' of {op} is given twice")));
            }
            items.push((key, value));
        }
    }
}
