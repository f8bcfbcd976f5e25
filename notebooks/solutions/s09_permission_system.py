my_spellings = ['r""m -rf ~', "rm$IFS-r\\f ~", "'r'm -'rf' ~"]
