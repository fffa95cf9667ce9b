// tests/cpp/test_tuning.cpp: the measurement knobs of src/core/tuning.h: defaults, accepted values,
// and an error naming the variable for every malformed one (parse_tuning with a fake environment).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/tuning.h"
#include "sparsemla/error.h"

namespace sparsemla::core {
namespace {

std::map<std::string, std::string>& fake_env() {
  static std::map<std::string, std::string> env;
  return env;
}
const char* lookup(const char* name) {
  const auto it = fake_env().find(name);
  return it == fake_env().end() ? nullptr : it->second.c_str();
}
Tuning parse_with(const std::map<std::string, std::string>& env) {
  fake_env() = env;
  return parse_tuning(lookup);
}

TEST(Tuning, DefaultsAreTheMeasuredChoices) {
  const Tuning t = parse_with({});
  EXPECT_TRUE(t.generic_ws);
  EXPECT_TRUE(t.combine_lean);
  EXPECT_EQ(t.generic_head_blocks, 0);
  EXPECT_EQ(t.rescale_lag, 0.0f);
  EXPECT_EQ(t.cpu_isa, CpuIsaChoice::Auto);
  EXPECT_EQ(parse_with({{"SPARSEMLA_RESCALE_LAG", ""}}).rescale_lag, 0.0f);  // empty: unset
}

TEST(Tuning, AcceptedValues) {
  const Tuning t = parse_with({{"SPARSEMLA_GENERIC_WS", "0"},
                               {"SPARSEMLA_COMBINE_LEAN", "0"},
                               {"SPARSEMLA_GENERIC_HB", "2"},
                               {"SPARSEMLA_RESCALE_LAG", "8"}});
  EXPECT_FALSE(t.generic_ws);
  EXPECT_FALSE(t.combine_lean);
  EXPECT_EQ(t.generic_head_blocks, 2);
  EXPECT_EQ(t.rescale_lag, 8.0f);
  EXPECT_EQ(parse_with({{"SPARSEMLA_RESCALE_LAG", "1.5"}}).rescale_lag, 1.5f);
  EXPECT_EQ(parse_with({{"SPARSEMLA_CPU_ISA", "baseline"}}).cpu_isa, CpuIsaChoice::Baseline);
  EXPECT_EQ(parse_with({{"SPARSEMLA_CPU_ISA", "avx2"}}).cpu_isa, CpuIsaChoice::Avx2);
  EXPECT_EQ(parse_with({{"SPARSEMLA_CPU_ISA", "avx512"}}).cpu_isa, CpuIsaChoice::Avx512);
  EXPECT_EQ(parse_with({{"SPARSEMLA_CPU_ISA", "auto"}}).cpu_isa, CpuIsaChoice::Auto);
}

TEST(Tuning, MalformedValuesNameTheVariable) {
  const std::map<std::string, std::string> bad[] = {
      {{"SPARSEMLA_GENERIC_WS", "yes"}},     {{"SPARSEMLA_GENERIC_HB", "3"}},
      {{"SPARSEMLA_COMBINE_LEAN", "2"}},     {{"SPARSEMLA_GENERIC_HB", "4x"}},
      {{"SPARSEMLA_RESCALE_LAG", "-1"}},     {{"SPARSEMLA_RESCALE_LAG", "65"}},
      {{"SPARSEMLA_RESCALE_LAG", "8 nats"}}, {{"SPARSEMLA_RESCALE_LAG", "nan"}},
      {{"SPARSEMLA_CPU_ISA", "sse2"}},       {{"SPARSEMLA_CPU_ISA", "AVX2"}},
  };
  for (const auto& env : bad) {
    const std::string name = env.begin()->first;
    try {
      parse_with(env);
      ADD_FAILURE() << "accepted " << name << "=" << env.begin()->second;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("argument '" + name + "'"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace sparsemla::core
