// trainer/cmd_plan.c — placeholder until the planner lands.
#include "trainer/commands.h"
int cmd_plan(int argc, char **argv) { (void)argc, (void)argv; return cmd_not_built("plan", "issue 2"); }
