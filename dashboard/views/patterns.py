"""Patterns: a dilated config or a block-sparse pattern → its mask picture and density."""

import streamlit as st

from dashboard import figures, patterns_view as pv

st.title("Patterns")
st.caption("Which (query, key) pairs a configuration attends to. Darker = counted more often "
           "(LongNet counts a key reached by two branches twice).")


@st.cache_data(max_entries=32, show_spinner="drawing the pattern…")
def dilated_picture(n, heads, segments, rates, mode, causal):
    """Cached by its parameters: a widget change elsewhere on the page redraws nothing."""
    res = pv.dilated_pattern(n, heads, segments, rates, mode, causal)
    return {key: res[key] for key in ("counts", "head_density", "density", "max_multiplicity")} | {
        "parts": len(res["parts"])}


@st.cache_data(max_entries=32, show_spinner="drawing the pattern…")
def block_sparse_picture(spec, n, heads, head, causal):
    res = pv.block_sparse_pattern(spec, n, heads, head, causal)
    return {"density": res["density"], "figure": res["figure"]}


kind = st.radio("pattern family", ["dilated", "block-sparse"], horizontal=True, key="pat_kind")

c1, c2, c3 = st.columns(3)
n = c1.number_input("sequence length N", min_value=8, max_value=pv.MAX_N, value=256, step=8, key="pat_n")
causal = c3.toggle("causal", value=False, key="pat_causal")
heads = c2.number_input("heads H", min_value=1, max_value=pv.MAX_HEADS, value=4, key="pat_heads")

if kind == "dilated":
    c4, c5, c6 = st.columns(3)
    seg_text = c4.text_input("segment lengths", "64, 128", key="pat_segments")
    rate_text = c5.text_input("dilation rates", "1, 2", key="pat_rates")
    mode = c6.selectbox("mode", ["longnet", "groups"], key="pat_mode")
    try:
        res = dilated_picture(int(n), int(heads), pv.parse_ints("segment lengths", seg_text),
                              pv.parse_ints("dilation rates", rate_text), mode, causal)
    except (ValueError, TypeError) as exc:
        st.error(str(exc))
    else:
        m = st.columns(3)
        m[0].metric("density (all heads)", f"{res['density']:.2%}",
                    help="attended (head, query, key) triples with multiplicity ÷ H·N²")
        m[1].metric("parts", res["parts"], help="dense attention problems the config becomes")
        m[2].metric("max multiplicity", res["max_multiplicity"])
        head = st.slider("head", 0, int(heads) - 1, 0, key="pat_head") if heads > 1 else 0
        st.plotly_chart(figures.mask_figure(res["counts"][head], title=f"head {head} of {heads}, N={n}"),
                        width="stretch", key="pat_mask")
        st.plotly_chart(figures.density_bar(res["head_density"]), width="stretch", key="pat_density")
else:
    names = pv.static_pattern_names()
    name = st.selectbox("pattern", names, key="pat_name")
    spec = st.text_input("spec (the pattern and its parameters, as in `block-sparse:<spec>`)",
                         pv.example_spec(name), key=f"pat_spec_{name}")
    head = st.slider("head", 0, int(heads) - 1, 0, key="pat_bs_head") if heads > 1 else 0
    try:
        res = block_sparse_picture(spec, int(n), int(heads), head, causal)
    except (ValueError, TypeError) as exc:
        st.error(str(exc))
    else:
        st.metric("density (all heads)", f"{res['density']:.2%}", help="allowed (head, query, key) triples ÷ H·N²")
        st.plotly_chart(res["figure"], width="stretch", key="pat_mask")
