// Which matrices take the interleaved layout is chosen by role (layout_roles.h): the role of
// every GGUF matrix name the architectures use, and the KILN_CUDA_INTERLEAVED_Q4K / _Q6K text.
#include <gtest/gtest.h>

#include "backend/cuda/layout_roles.h"

namespace kiln::cuda {
namespace {

TEST(LayoutRoles, NamesTheRoleOfEachMatrix) {
  EXPECT_EQ(layout_role("blk.0.ffn_gate.weight"), kLayoutGateUp);
  EXPECT_EQ(layout_role("blk.31.ffn_up.weight"), kLayoutGateUp);
  EXPECT_EQ(layout_role("blk.3.ffn_gate_shexp.weight"), kLayoutGateUp);
  EXPECT_EQ(layout_role("blk.3.ffn_gate_inp.weight"), kLayoutOther) << "the MoE router is no gate";
  EXPECT_EQ(layout_role("blk.12.ffn_down.weight"), kLayoutDown);
  EXPECT_EQ(layout_role("blk.12.ffn_down_shexp.weight"), kLayoutDown);
  EXPECT_EQ(layout_role("blk.1.attn_q.weight"), kLayoutQkv);
  EXPECT_EQ(layout_role("blk.1.attn_k.weight"), kLayoutQkv);
  EXPECT_EQ(layout_role("blk.1.attn_v.weight"), kLayoutQkv);
  EXPECT_EQ(layout_role("blk.1.attn_qkv.weight"), kLayoutQkv);
  EXPECT_EQ(layout_role("blk.1.attn_q_norm.weight"), kLayoutOther);
  EXPECT_EQ(layout_role("blk.1.attn_output.weight"), kLayoutO);
  EXPECT_EQ(layout_role("output.weight"), kLayoutHead);
  EXPECT_EQ(layout_role("token_embd.weight"), kLayoutHead);
  EXPECT_EQ(layout_role("output_norm.weight"), kLayoutOther);
  EXPECT_EQ(layout_role("blk.2.ssm_out.weight"), kLayoutOther);
  EXPECT_EQ(layout_role("blk."), kLayoutOther);
  EXPECT_EQ(layout_role(""), kLayoutOther);
}

TEST(LayoutRoles, ParsesNoneAllAndListsOfRoles) {
  EXPECT_EQ(parse_layout_roles("none"), kLayoutNone);
  EXPECT_EQ(parse_layout_roles("all"), kLayoutAll);
  EXPECT_EQ(parse_layout_roles("down"), kLayoutDown);
  EXPECT_EQ(parse_layout_roles("gate_up,o"), kLayoutGateUp | kLayoutO);
  EXPECT_EQ(parse_layout_roles("down,head,qkv"), kLayoutDown | kLayoutHead | kLayoutQkv);
  EXPECT_EQ(parse_layout_roles("other"), kLayoutOther);
}

TEST(LayoutRoles, RefusesTextThatNamesNoRole) {
  EXPECT_EQ(parse_layout_roles(""), std::nullopt);
  EXPECT_EQ(parse_layout_roles("gate"), std::nullopt);
  EXPECT_EQ(parse_layout_roles("down,"), std::nullopt);
  EXPECT_EQ(parse_layout_roles(",down"), std::nullopt);
  EXPECT_EQ(parse_layout_roles("Down"), std::nullopt);
  EXPECT_EQ(parse_layout_roles("2"), std::nullopt);
}

}  // namespace
}  // namespace kiln::cuda
