"""Hypothesis strategies for JSON values a record may carry (shared by property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

#: Short strings of any encodable code point (no lone surrogates).
short_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
#: Small JSON documents: null, booleans, integers, strings, nested lists and objects.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | short_text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(short_text, kids, max_size=3),
    max_leaves=6,
)
