// The loss scaler's state machine, step by step, against torch.amp.GradScaler's rules.
#include <gtest/gtest.h>

#include "dfp/loss_scale.hpp"
#include "dfp/status.hpp"

using namespace dfp;

TEST(LossScaler, DynamicGrowsBacksOffAndSkips) {
  LossScaleOptions o;
  o.mode = LossScaleMode::dynamic;
  o.growth_interval = 3;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_TRUE(s.update(true));  // third clean step: grow, tracker resets
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // inf: skip, halve, reset the tracker
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.skipped_steps(), 1u);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.skipped_steps(), 2u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScaler, DefaultsAreGradScalers) {
  LossScaleOptions o;
  EXPECT_EQ(o.initial_scale(), 65536.0);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
  o.mode = LossScaleMode::dynamic;
  LossScaler s(o);
  for (int i = 0; i < 1999; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScaler, StaticAndNoneKeepTheirScaleButStillSkipNonFiniteSteps) {
  LossScaleOptions o;
  o.mode = LossScaleMode::fixed;
  o.init_scale = 1024;
  LossScaler s(o);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024.0);
  for (int i = 0; i < 5000; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1024.0);
  LossScaler n{LossScaleOptions{}};
  EXPECT_EQ(n.scale(), 1.0);
  EXPECT_FALSE(n.update(false));
  EXPECT_EQ(n.skipped_steps(), 1u);
  EXPECT_EQ(n.scale(), 1.0);
}

// Adaptive scaling starts at 1 (its per-layer factors do the scaling) unless a scale is given.
TEST(LossScaler, AdaptiveStartsAtOneUnlessGivenAScale) {
  LossScaleOptions o;
  o.mode = LossScaleMode::adaptive;
  EXPECT_EQ(LossScaler(o).scale(), 1.0);
  o.init_scale = 8;
  EXPECT_EQ(LossScaler(o).scale(), 8.0);
  o.mode = LossScaleMode::dynamic;
  o.init_scale.reset();
  EXPECT_EQ(LossScaler(o).scale(), 65536.0);
}

TEST(LossScaler, RejectsBadOptionsAndNames) {
  LossScaleOptions o;
  o.mode = LossScaleMode::fixed;
  o.init_scale = 0;
  EXPECT_THROW(LossScaler{o}, Error);
  EXPECT_THROW(parse_loss_scale_mode("dyn", "flag --loss-scaling"), Error);
  EXPECT_EQ(parse_loss_scale_mode("static", "x"), LossScaleMode::fixed);
}
